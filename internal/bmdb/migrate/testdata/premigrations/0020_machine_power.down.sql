DROP TABLE IF EXISTS machine_power;
