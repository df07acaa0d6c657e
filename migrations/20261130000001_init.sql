-- seckill ledger schema (DESIGN §6). The ledger is the final word on what was sold; Redis is a
-- fast pre-filter that may be wrong after faults. MySQL 8 / MariaDB 10.11, InnoDB.

-- The plan of a sale.
CREATE TABLE activity (
    id              BIGINT UNSIGNED  NOT NULL PRIMARY KEY,
    total_stock     BIGINT UNSIGNED  NOT NULL,
    bucket_count    INT UNSIGNED     NOT NULL,
    fallback_pct    TINYINT UNSIGNED NOT NULL,
    per_user_limit  INT UNSIGNED     NOT NULL DEFAULT 1,
    start_ms        BIGINT UNSIGNED  NOT NULL,
    end_ms          BIGINT UNSIGNED  NOT NULL,
    pay_timeout_ms  BIGINT UNSIGNED  NOT NULL,
    plan_version    CHAR(16)         NOT NULL,
    state           VARCHAR(16)      NOT NULL DEFAULT 'open',
    created_at      TIMESTAMP(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    CONSTRAINT activity_total_positive   CHECK (total_stock >= 1),
    CONSTRAINT activity_buckets_range    CHECK (bucket_count BETWEEN 1 AND 1024),
    CONSTRAINT activity_fallback_range   CHECK (fallback_pct <= 50),
    CONSTRAINT activity_window           CHECK (start_ms < end_ms),
    CONSTRAINT activity_state_known      CHECK (state IN ('open', 'paused', 'recovering', 'closed'))
) ENGINE = InnoDB;

-- Stock per bucket; bucket_no = bucket_count is the fallback bucket. The conditional update
-- `remaining = remaining - qty WHERE remaining >= qty` is the last guard against overselling.
CREATE TABLE stock_bucket (
    activity_id  BIGINT UNSIGNED NOT NULL,
    bucket_no    INT UNSIGNED    NOT NULL,
    initial      BIGINT UNSIGNED NOT NULL,
    remaining    BIGINT          NOT NULL,
    PRIMARY KEY (activity_id, bucket_no),
    CONSTRAINT stock_bucket_activity FOREIGN KEY (activity_id) REFERENCES activity (id),
    CONSTRAINT stock_bucket_non_negative CHECK (remaining >= 0)
) ENGINE = InnoDB;

-- One row per reservation that reached the ledger. Both unique keys are the idempotency of the
-- consumer: a redelivered reservation hits uk_reservation, a second buyer uk_activity_user.
CREATE TABLE seckill_order (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    reservation_id  CHAR(32)        NOT NULL,
    activity_id     BIGINT UNSIGNED NOT NULL,
    user_id         BIGINT UNSIGNED NOT NULL,
    bucket_no       INT UNSIGNED    NOT NULL,
    qty             INT UNSIGNED    NOT NULL,
    status          VARCHAR(16)     NOT NULL,
    reserved_at_ms  BIGINT UNSIGNED NOT NULL,
    created_at      TIMESTAMP(3)    NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at      TIMESTAMP(3)    NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    UNIQUE KEY uk_reservation (reservation_id),
    UNIQUE KEY uk_activity_user (activity_id, user_id),
    KEY ix_status_created (activity_id, status, created_at),
    CONSTRAINT seckill_order_bucket FOREIGN KEY (activity_id, bucket_no) REFERENCES stock_bucket (activity_id, bucket_no),
    CONSTRAINT seckill_order_qty_positive CHECK (qty >= 1),
    CONSTRAINT seckill_order_status_known CHECK (status IN ('created', 'paid', 'cancelled', 'failed'))
) ENGINE = InnoDB;

-- Every stock movement with its reference (reservation or transfer id):
-- SUM(delta) per bucket = remaining - initial.
CREATE TABLE stock_journal (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    activity_id  BIGINT UNSIGNED NOT NULL,
    bucket_no    INT UNSIGNED    NOT NULL,
    kind         VARCHAR(16)     NOT NULL,
    reference    VARCHAR(64)     NOT NULL,
    delta        BIGINT          NOT NULL,
    created_at   TIMESTAMP(3)    NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    UNIQUE KEY uk_movement (activity_id, bucket_no, kind, reference),
    CONSTRAINT stock_journal_bucket FOREIGN KEY (activity_id, bucket_no) REFERENCES stock_bucket (activity_id, bucket_no),
    CONSTRAINT stock_journal_kind_known CHECK (kind IN ('order', 'cancel', 'transfer', 'adjust'))
) ENGINE = InnoDB;
