DROP TRIGGER shepherd_due_leases_ended ON work;
DROP FUNCTION shepherd_leases_ended();
CREATE TRIGGER shepherd_due_lease_ended AFTER DELETE ON work
    FOR EACH ROW EXECUTE FUNCTION shepherd_lease_ended();
