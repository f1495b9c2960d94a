-- shepherd: compatible-with-previous
--
-- Rolling upgrades: what each applied migration declares about the
-- binaries of the schema before it. A binary of release N started on a
-- schema that 'migrate up' of release N+1 moved ahead reads the rows of
-- the versions it does not know, and runs exactly when every one of them
-- says binaries of the previous schema may keep running on it. Its own
-- embedded files cannot tell it: the newer migrations are not among them.
--
-- 'migrate up' records the rows from the "-- shepherd:" lines of the
-- migration files (see bmdb.Declaration): before it applies the pending
-- migrations, so that no binary ever sees an applied version without its
-- row, and again after, for the migrations that created this table.
CREATE TABLE migration_declarations (
    -- '' for Shepherd's own schema, the extension's name for a process's
    -- (bmdb.Extension), whose versions are numbered on their own.
    schema_name TEXT NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0),
    -- Binaries of schema version-1 may keep running on this version: the
    -- migration only adds (an expand step). False for a contract step
    -- (a dropped or renamed column, a stricter constraint), which the
    -- binaries before it would break on.
    compatible_with_previous BOOLEAN NOT NULL,
    -- The release that brought the migration, named to an operator whose
    -- binary is too old to run on it; '' when the file names none.
    release TEXT NOT NULL DEFAULT '',
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (schema_name, version)
);
