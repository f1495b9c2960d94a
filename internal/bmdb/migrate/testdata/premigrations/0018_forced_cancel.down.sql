-- Pending run-now and cancel requests go with the commands that made them.
DROP TABLE work_cancel;
DROP TABLE work_forced;
