//! The model against the engine: the checker's traces replayed through the engine's own
//! recovery on the embedded stores (`replay`), and the checker itself at the CI bound (`check`).

mod check;
mod replay;
