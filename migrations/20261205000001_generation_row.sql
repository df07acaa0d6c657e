-- The generation in a row of its own (DESIGN §11.3). Every batch of orders holds a shared lock
-- on it to COMMIT, so that a recovery's bump waits for the batches in flight; on the activity
-- row, the operator's intent write (a pause) queued behind every such lock, and every batch
-- after it behind the pause — a worker stalled inside its transaction held the sale's pause
-- back until the server rolled it back. Here the bump alone waits for the batches.
CREATE TABLE activity_generation (
    activity_id  BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    generation   BIGINT UNSIGNED NOT NULL DEFAULT 0,
    CONSTRAINT activity_generation_activity FOREIGN KEY (activity_id) REFERENCES activity (id)
) ENGINE = InnoDB;

INSERT INTO activity_generation (activity_id, generation) SELECT id, generation FROM activity;

ALTER TABLE activity DROP COLUMN generation;
