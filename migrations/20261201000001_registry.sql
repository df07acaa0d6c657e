-- The activity registry (DESIGN §11.2): `activity.state` is the operator's intent (open, paused,
-- closed), `intent_version` orders its changes (a gate never takes an older intent over a newer
-- one) and `generation` is bumped by every recovery (§11.3). Each order records the generation
-- it was reserved under; the ledger refuses one older than the activity's.
ALTER TABLE activity
    ADD COLUMN intent_version BIGINT UNSIGNED NOT NULL DEFAULT 1,
    ADD COLUMN generation     BIGINT UNSIGNED NOT NULL DEFAULT 0;

ALTER TABLE seckill_order
    ADD COLUMN generation BIGINT UNSIGNED NOT NULL DEFAULT 0;
