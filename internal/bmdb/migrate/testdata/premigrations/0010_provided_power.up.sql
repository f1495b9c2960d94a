-- shepherd: compatible-with-previous
-- How a machine's provider reboots it (redfish, ipmi, ssh; '' when the
-- provider does not say), shown by the status page and 'shepherd machines
-- -all' so that an operator sees which BMC Recovery will use.
ALTER TABLE machine_provided ADD COLUMN power TEXT NOT NULL DEFAULT '';
