DROP TABLE machine_firmware;
