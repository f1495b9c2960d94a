DROP TABLE migration_declarations;
