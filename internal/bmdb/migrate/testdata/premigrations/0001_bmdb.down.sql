DROP TABLE work_history;
DROP TABLE work_backoff;
DROP TABLE work;
DROP TABLE sessions;
DROP TABLE machine_agent_heartbeat;
DROP TABLE machine_agent_started;
DROP TABLE machine_provided;
DROP TABLE machines;
