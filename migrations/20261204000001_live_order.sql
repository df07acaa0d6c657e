-- One live order per user (DESIGN §6): the unique key covers non-failed orders only. An order the
-- system failed (refused for an older generation after Redis lost data, or out of stock because
-- Redis overstated) frees its user to buy again; a cancelled one does not. `live_user` is the
-- user while the order is live and NULL once it failed, and a unique key admits any number of
-- NULLs. `ix_activity_user` keeps the lookup of a user's orders (live first) an index read.
ALTER TABLE seckill_order
    ADD COLUMN live_user BIGINT UNSIGNED AS (IF(status = 'failed', NULL, user_id)) STORED,
    ADD KEY ix_activity_user (activity_id, user_id),
    DROP KEY uk_activity_user,
    ADD UNIQUE KEY uk_activity_live_user (activity_id, live_user);
