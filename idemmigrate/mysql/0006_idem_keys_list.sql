-- idem: the operators' list pages through a tenant's records in claim
-- order; same index and meaning as postgres/0005_idem_keys_list.sql.
--
-- MySQL 8 has no CREATE INDEX IF NOT EXISTS (MariaDB has): the statement
-- runs only when the index is missing, so the file is safe to run again
-- by hand. InnoDB builds it in place (ALGORITHM=INPLACE, LOCK=NONE): claims
-- go on while it is built.
SET @idem_list_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.statistics
     WHERE table_schema = DATABASE() AND table_name = 'idem_keys' AND index_name = 'idem_keys_tenant_created_idx') = 0,
    'CREATE INDEX idem_keys_tenant_created_idx ON idem_keys (tenant_id, created_at, idem_key)',
    'DO 0');
PREPARE idem_list_stmt FROM @idem_list_ddl;
EXECUTE idem_list_stmt;
DEALLOCATE PREPARE idem_list_stmt;
