-- Payments (DESIGN §12): an order becomes paid only by the payment provider's signed callback,
-- which names its payment. The id is recorded so that the same callback again is answered the
-- same, and a second, different payment for a paid order is told apart (a double charge).
ALTER TABLE seckill_order
    ADD COLUMN payment_id VARCHAR(64) NULL;
