-- The holds go with the table: every held machine is claimed again, and
-- the due rows of machines held until released are rebuilt by the next
-- reconcile pass (or registration) of their processes.
DROP TABLE machine_hold;
DROP FUNCTION shepherd_machine_hold_ended();
