-- idem: the operators' list pages through a tenant's records in claim
-- order; same index and meaning as postgres/0005_idem_keys_list.sql.
CREATE INDEX IF NOT EXISTS idem_keys_tenant_created_idx ON idem_keys (tenant_id, created_at, idem_key);
