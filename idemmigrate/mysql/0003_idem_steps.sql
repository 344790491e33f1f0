-- idem: recovery points. idem.Step records each step of an operation (a
-- card charged, an e-mail sent) here, with its result, as it completes, so
-- that an execution taking over a key whose holder died gets the results
-- back instead of doing the steps again. Same column and meaning as
-- postgres/0003_idem_steps.sql.
--
-- The column holds the steps in idem's canonical encoding (for each step,
-- its name and its value, each a uvarint length and its bytes), which
-- concatenates: a step is appended with CONCAT(steps, step), without
-- reading the column first. NULL means no step recorded. A claim that
-- takes over an in-flight record keeps it; a claim over a record past
-- retention clears it; a release keeps a record that holds steps in
-- flight, its lease ended, instead of deleting it.
--
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS (MariaDB has), and commits DDL
-- by itself, so the file is made safe to run again by hand: the ALTER runs
-- only when the column is missing. InnoDB adds a nullable column at the end
-- of the table in place (ALGORITHM=INSTANT on MySQL 8.0.12+ and MariaDB
-- 10.3+), without copying the table; the server picks it by itself.
SET @idem_steps_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = 'idem_keys' AND column_name = 'steps') = 0,
    'ALTER TABLE idem_keys ADD COLUMN steps LONGBLOB',
    'DO 0');
PREPARE idem_steps_stmt FROM @idem_steps_ddl;
EXECUTE idem_steps_stmt;
DEALLOCATE PREPARE idem_steps_stmt;
