DROP TABLE process_registrants;
