ALTER TABLE machine_provided DROP COLUMN power;
