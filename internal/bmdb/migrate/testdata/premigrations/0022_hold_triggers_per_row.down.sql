DROP TRIGGER shepherd_due_backoff_ended ON work_backoff;
DROP TRIGGER shepherd_due_not_before_ended ON work_not_before;
DROP TRIGGER shepherd_due_backoff_shortened ON work_backoff;
DROP TRIGGER shepherd_due_not_before_shortened ON work_not_before;
DROP TRIGGER shepherd_due_machine_hold_released ON machine_hold;
DROP TRIGGER shepherd_due_machine_hold_shortened ON machine_hold;
DROP FUNCTION shepherd_hold_row_ended();

CREATE TRIGGER shepherd_due_backoff_ended AFTER DELETE ON work_backoff
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_ended();
CREATE TRIGGER shepherd_due_not_before_ended AFTER DELETE ON work_not_before
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_ended();
CREATE TRIGGER shepherd_due_backoff_shortened AFTER UPDATE ON work_backoff
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_shortened();
CREATE TRIGGER shepherd_due_not_before_shortened AFTER UPDATE ON work_not_before
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_shortened();
CREATE TRIGGER shepherd_due_machine_hold_released AFTER DELETE ON machine_hold
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machine_hold_ended();
CREATE TRIGGER shepherd_due_machine_hold_shortened AFTER UPDATE ON machine_hold
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machine_hold_ended();
