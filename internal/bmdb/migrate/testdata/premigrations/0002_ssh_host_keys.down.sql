DROP TABLE machine_ssh_host_key;
