-- The price of one unit in the currency's minor unit (DESIGN §12: the payment callback's amount
-- is signed and must be the order's quantity times this). Activities created before it are free.
ALTER TABLE activity ADD COLUMN unit_price_minor BIGINT UNSIGNED NOT NULL DEFAULT 0;
