//! seckill: the binary's commands (`serve`, `demo`, `audit`, `bench`, `load`, `stages`, `plan`,
//! …) and the `serve` wiring that composes the roles over the stores its settings name.

pub mod cli;
