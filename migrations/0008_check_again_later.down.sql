DROP TABLE work_not_before;
