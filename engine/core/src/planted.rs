//! Planted bugs: small, named variants of real code, each switched on by name, and the engine's
//! fault points (stalls). They exist to prove that the simulation's checkers can fail: a run
//! with a bug planted must be caught within a few seeds, and the same seeds must pass without it.
//!
//! The simulation turns them on per thread (it builds this crate with the `planted` feature); the
//! real-store nemesis per process (`plant_process` and `stall_process`: the `seckill` binary
//! built with its own `planted` feature reads `SECKILL_PLANTED` and `SECKILL_STALLS`). Without
//! the feature `on` is a constant `false`
//! and every fault point returns at once, so each call site is plain code beside the code it
//! breaks, with no `cfg` of its own, and costs nothing in the binary.

use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bug {
    /// Reserve reads the stock, then decrements it in a second call from Rust.
    NonAtomicReserve,
    /// The consumer commits offsets before the ledger applies the batch.
    AckBeforeCommit,
    /// A release goes to `route(user)` instead of the reservation's own bucket.
    ReleaseToRoutedBucket,
    /// An empty own bucket falls back without leaving the pending-fallback mark.
    FallbackWithoutPendingMark,
    /// The consumer treats a redelivered order as a duplicate buyer and releases its unit.
    RedeliveredAsDuplicate,
    /// The engine releases the units when a publish's outcome is unknown.
    ReleaseOnIndeterminatePublish,
    /// The ledger has no UNIQUE(activity_id, user_id).
    NoBuyerUniqueKey,
    /// The ledger's stock update lacks `remaining >= qty`.
    NoStockGuard,
    /// The payment timeout releases a cancelled unit to `route(user)`, not its own bucket.
    CancelReleaseToRoutedBucket,
    /// Recovery rebuilds Redis from the ledger at once: no quiesce, no waiting for the topic to drain.
    RebuildWhileInFlight,
    /// The reconciler republishes an open reservation under a fresh id (the ledger cannot dedupe).
    RepublishWithFreshId,
    /// A rebalancing `give` is not idempotent: finishing a transfer twice gives its units twice.
    NonIdempotentGive,
    /// The reconciler reads the ledger before Redis (so a pass that races the consumer sees a
    /// difference that is not one) and "fixes" differences by resetting the bucket's Redis stock.
    ReconcilerResetsStock,
    /// Warmup of an installed activity writes stock from the plan, even after orders exist.
    WarmupFromPlan,
    /// The rebuild drops the outbox: open reservations the ledger lacks are deleted, not rescued.
    RebuildDropsOutbox,
    /// The reopen returns to the intent read when the recovery began, over a later pause.
    ReopenOverPause,
    /// `reserve.lua` without its gate check.
    GateNotChecked,
    /// The ledger applies orders of any generation.
    NoGenerationCheck,
    /// Recovery without the fence: a runner goes on past another runner's live claim, and
    /// rebuilds and reopens buckets whose gates another claim closed (it closes them again
    /// under its own fence first, as a gate script that ignored the fence would let it).
    RecoveryWithoutFence,
    /// The recovery's generation bump is an unconditional `generation + 1`: a runner stalled
    /// before it past its lease, or whose bump the network delivers late, bumps after its
    /// successor reopened the gates (the ledger model drops the condition).
    UnfencedBump,
    /// The consumer ignores a failed rewind and polls on from where the failed batch left the
    /// source's position (its records are never applied; the next batch commits past them).
    FailedRewindIgnored,
    /// A failed order locks its user out, as before one live order per user: the consumer and
    /// the reconciler settle it (the buyer mark stays) and the rebuild marks its user.
    FailedOrderLocksOut,
    /// The recovery republishes the outbox it rescues (and drains) instead of applying it to the
    /// ledger: a rescued record that becomes visible after the bump is refused as stale.
    RescueRepublished,
}

impl Bug {
    pub const ALL: [Bug; 23] = [
        Bug::NonAtomicReserve,
        Bug::AckBeforeCommit,
        Bug::ReleaseToRoutedBucket,
        Bug::FallbackWithoutPendingMark,
        Bug::RedeliveredAsDuplicate,
        Bug::ReleaseOnIndeterminatePublish,
        Bug::NoBuyerUniqueKey,
        Bug::NoStockGuard,
        Bug::CancelReleaseToRoutedBucket,
        Bug::RebuildWhileInFlight,
        Bug::RepublishWithFreshId,
        Bug::NonIdempotentGive,
        Bug::ReconcilerResetsStock,
        Bug::WarmupFromPlan,
        Bug::RebuildDropsOutbox,
        Bug::ReopenOverPause,
        Bug::GateNotChecked,
        Bug::NoGenerationCheck,
        Bug::RecoveryWithoutFence,
        Bug::UnfencedBump,
        Bug::FailedRewindIgnored,
        Bug::FailedOrderLocksOut,
        Bug::RescueRepublished,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::NonAtomicReserve => "non_atomic_reserve",
            Bug::AckBeforeCommit => "ack_before_commit",
            Bug::ReleaseToRoutedBucket => "release_to_routed_bucket",
            Bug::FallbackWithoutPendingMark => "fallback_without_pending_mark",
            Bug::RedeliveredAsDuplicate => "redelivered_as_duplicate",
            Bug::ReleaseOnIndeterminatePublish => "release_on_indeterminate_publish",
            Bug::NoBuyerUniqueKey => "no_buyer_unique_key",
            Bug::NoStockGuard => "no_stock_guard",
            Bug::CancelReleaseToRoutedBucket => "cancel_release_to_routed_bucket",
            Bug::RebuildWhileInFlight => "rebuild_while_in_flight",
            Bug::RepublishWithFreshId => "republish_with_fresh_id",
            Bug::NonIdempotentGive => "non_idempotent_give",
            Bug::ReconcilerResetsStock => "reconciler_resets_stock",
            Bug::WarmupFromPlan => "warmup_from_plan",
            Bug::RebuildDropsOutbox => "rebuild_drops_outbox",
            Bug::ReopenOverPause => "reopen_over_pause",
            Bug::GateNotChecked => "gate_not_checked",
            Bug::NoGenerationCheck => "no_generation_check",
            Bug::RecoveryWithoutFence => "recovery_without_fence",
            Bug::UnfencedBump => "unfenced_bump",
            Bug::FailedRewindIgnored => "failed_rewind_ignored",
            Bug::FailedOrderLocksOut => "failed_order_locks_out",
            Bug::RescueRepublished => "rescue_republished",
        }
    }

    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

thread_local! {
    /// The planted set, one bit per bug. Per thread: a madsim runtime runs every simulated node
    /// on the thread that drives it, so this reaches all of them — and test threads running
    /// other seeds in parallel are not affected.
    static PLANTED: Cell<u32> = const { Cell::new(0) };
}

thread_local! {
    /// Fresh numbers for the planted bugs that need them (`fresh`), counted from 0 in every run,
    /// so that a seed draws the same ones whatever ran before it on this thread.
    static FRESH: Cell<u64> = const { Cell::new(0) };
}

/// The bugs planted in the whole process (`plant_process`), one bit per bug: a real process
/// runs its tasks on any of its runtime's threads.
static PROCESS: AtomicU32 = AtomicU32::new(0);

/// Plant `bug` in every thread of this process, for good: the real binary under the nemesis.
/// Refused (false) by a build without the `planted` feature, which must never plant anything.
pub fn plant_process(bug: Bug) -> bool {
    if ENABLED {
        PROCESS.fetch_or(1 << bug as u32, Ordering::Relaxed);
    }
    ENABLED
}

/// Plant exactly `bug` (or none) for runs on this thread.
pub fn plant(bug: Option<Bug>) {
    PLANTED.with(|p| p.set(bug.map_or(0, |b| 1 << b as u32)));
    FRESH.with(|f| f.set(0));
}

/// The next fresh number of this run (see `FRESH`).
pub fn fresh() -> u64 {
    FRESH.with(|f| {
        let n = f.get();
        f.set(n + 1);
        n
    })
}

/// Whether `bug` is planted in this run (always `false` without the `planted` feature).
#[inline]
pub fn on(bug: Bug) -> bool {
    ENABLED && (PLANTED.with(|p| p.get()) | PROCESS.load(Ordering::Relaxed)) & (1 << bug as u32) != 0
}

/// Whether this build can plant bugs and stall at fault points at all.
const ENABLED: bool = cfg!(feature = "planted");

/// Whether this build can plant bugs (the `planted` feature; cargo unifies it into whatever a
/// workspace-wide build compiles, the simulation asking for it).
pub const fn enabled() -> bool {
    ENABLED
}

thread_local! {
    /// Fault points (stalls) enabled for runs on this thread: the xorshift state of their draws
    /// (0: off). Seeded by the simulation, so a seed replays the same stalls.
    static STALLS: Cell<u64> = const { Cell::new(0) };
}

thread_local! {
    /// The long fault points (`stall_once`) that fired in this run: one bit per site.
    static FIRED: Cell<u64> = const { Cell::new(0) };
    /// The short fault points (`stall`) are off: the simulation healed.
    static SHORT_OFF: Cell<bool> = const { Cell::new(false) };
    /// Processes asleep at a fault point now (a crash drops the sleep, and the count with it).
    static STALLED: Cell<u64> = const { Cell::new(0) };
    /// What the simulation does when a long fault point fires (with its site): aim a fault at
    /// the window the stall holds open.
    static ON_LONG_STALL: std::cell::RefCell<Option<LongStallHook>> = const { std::cell::RefCell::new(None) };
    /// The process asleep at a long fault point the simulation may end early (`wake`), by site.
    static WAKERS: std::cell::RefCell<Vec<(Site, std::sync::Arc<tokio::sync::Notify>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

type LongStallHook = Box<dyn Fn(Site)>;

/// The long fault points (`stall_once`): each fires at most once per run, where the simulation
/// arms it (`enable_stalls`, a mask of `Site::bit`s). The number is the site's bit; a report
/// counts a site that fired as `long_stall_<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// A recovery between its snapshot of the ledger and its rebuild.
    RecoveryRebuild = 0,
    /// A recovery between its rebuild and its reopen.
    RecoveryReopen = 1,
    /// A rebalancer between its take and its ledger step.
    RebalanceTake = 2,
    /// A recovery before its generation bump.
    RecoveryBump = 3,
    /// A recovery between its reopen and its finish.
    RecoveryFinish = 4,
    /// A recovery between its claim and its close.
    RecoveryClose = 5,
    /// A rebalancer between its look at the gates and its take.
    RebalanceLook = 6,
}

impl Site {
    pub const ALL: [Site; 7] = [
        Site::RecoveryRebuild,
        Site::RecoveryReopen,
        Site::RebalanceTake,
        Site::RecoveryBump,
        Site::RecoveryFinish,
        Site::RecoveryClose,
        Site::RebalanceLook,
    ];

    /// The site's name: its variant's, in snake_case.
    pub const fn name(self) -> &'static str {
        match self {
            Site::RecoveryRebuild => "recovery_rebuild",
            Site::RecoveryReopen => "recovery_reopen",
            Site::RebalanceTake => "rebalance_take",
            Site::RecoveryBump => "recovery_bump",
            Site::RecoveryFinish => "recovery_finish",
            Site::RecoveryClose => "recovery_close",
            Site::RebalanceLook => "rebalance_look",
        }
    }

    /// The site's bit in a mask of sites.
    pub const fn bit(self) -> u64 {
        1 << self as u32
    }
}

/// Call `f` with the site whenever a long fault point (`stall_once`) fires in this run.
pub fn on_long_stall(f: impl Fn(Site) + 'static) {
    ON_LONG_STALL.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// How many processes are asleep at a fault point now: the simulation waits them out before its
/// final look, so that a zombie's late writes land where the checks can see them.
pub fn stalled() -> u64 {
    STALLED.with(|s| s.get())
}

/// Enable the fault points for runs on this thread, drawing from `seed` (`None`: off), and of the
/// long ones (`stall_once`) the sites in the mask `long` (`Site::bit`s).
pub fn enable_stalls(seed: Option<u64>, long: u64) {
    STALLS.with(|s| s.set(seed.map_or(0, |x| x | 1)));
    // Off: every site counts as fired already.
    FIRED.with(|f| f.set(!long));
    SHORT_OFF.with(|s| s.set(false));
    STALLED.with(|s| s.set(0));
    ON_LONG_STALL.with(|h| h.borrow_mut().take());
    WAKERS.with(|w| w.borrow_mut().clear());
}

/// The faults stop (the simulation's heal): no short fault point stalls from here on, the
/// processes asleep at one sleep on. Without this, the stalls past a recovery's lease that go on
/// firing at every attempt could keep any recovery from ever finishing: a livelock of the
/// faults, not of the engine (the liveness that matters holds once faults stop). Of the long
/// ones not yet fired, those in the mask `keep` stay armed: each fires at most once, so it
/// cannot keep a recovery from finishing, and the recovery a fault started mostly runs after
/// the heal — disarmed there, the long fault points past the bump fired in almost no run.
pub fn stop_stalls(keep: u64) {
    SHORT_OFF.with(|s| s.set(true));
    FIRED.with(|f| f.set(f.get() | !keep));
}

/// The fault points armed in the whole process (`stall_process`): the xorshift state of their
/// draws (0: off), shared by every thread of a real process's runtime. Used where the thread's
/// own (`STALLS`, the simulation's) are off.
static PROCESS_STALLS: AtomicU64 = AtomicU64::new(0);
/// The long fault points that fired in this process (one bit per site).
static PROCESS_FIRED: AtomicU64 = AtomicU64::new(0);

/// Arm the fault points in this process for good, drawing from `seed`: the short ones all, of
/// the long ones (`stall_once`, each firing at most once per process) the sites in the mask
/// `long` (`Site::bit`s) — the real binary under the nemesis pauses itself exactly where a pause
/// hurts most, which no signal from outside can aim at. Refused (false) by a build without the
/// `planted` feature.
pub fn stall_process(seed: u64, long: u64) -> bool {
    if ENABLED {
        PROCESS_FIRED.store(!long, Ordering::Relaxed);
        PROCESS_STALLS.store(seed | 1, Ordering::Relaxed);
    }
    ENABLED
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Whether this thread's runs draw from the process's fault points (`stall_process`), not the
/// simulation's.
fn process_wide() -> bool {
    STALLS.with(|s| s.get()) == 0
}

fn draw() -> Option<u64> {
    if !ENABLED {
        return None;
    }
    if process_wide() {
        let prev = PROCESS_STALLS
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                (x != 0).then(|| xorshift(x))
            })
            .ok()?;
        return Some(xorshift(prev));
    }
    STALLS.with(|s| {
        let x = xorshift(s.get());
        s.set(x);
        Some(x)
    })
}

/// A fault point at a dangerous window of engine code (DESIGN §9 v2): when the simulation
/// enables them, one call in `one_in` stalls here for up to `max` — the process paused (GC,
/// SIGSTOP, a slow VM) exactly where a stall hurts most.
pub async fn stall(one_in: u64, max: std::time::Duration) {
    if !ENABLED || SHORT_OFF.with(|s| s.get()) {
        return;
    }
    let Some(x) = draw() else { return };
    if x % one_in != 0 {
        return;
    }
    sleep_drawn(x, max).await;
}

/// Sleep for the part of `max` that the draw `x` names.
async fn sleep_drawn(x: u64, max: std::time::Duration) {
    sleep_drawn_from(x, std::time::Duration::ZERO, max).await
}

/// Sleep `floor` and the part of `max - floor` that the draw `x` names.
async fn sleep_drawn_from(x: u64, floor: std::time::Duration, max: std::time::Duration) {
    struct Asleep;
    impl Drop for Asleep {
        fn drop(&mut self) {
            STALLED.with(|s| s.set(s.get().saturating_sub(1)));
        }
    }
    let floor_ms = floor.as_millis() as u64;
    let ms = floor_ms + (x >> 20) % (max.as_millis() as u64).saturating_sub(floor_ms).max(1);
    let sleep = tokio::time::sleep(std::time::Duration::from_millis(ms));
    if process_wide() {
        // A real process: its tasks move between threads, and nobody waits the sleepers out.
        return sleep.await;
    }
    STALLED.with(|s| s.set(s.get() + 1));
    let _asleep = Asleep;
    sleep.await;
}

/// A long fault point: like `stall`, but it fires at most once per run at `site` — a
/// stall far past a lease, at most once, so the process that takes over can finish (a stall
/// there at every pass would keep any recovery from ever finishing: no bug, a livelock of the
/// fault itself).
pub async fn stall_once(site: Site, one_in: u64, max: std::time::Duration) {
    stall_once_past(site, one_in, std::time::Duration::ZERO, max).await
}

/// `stall_once` for at least `floor`: a window that only hurts once another process has had
/// time to act in it (take over a claim and finish what it claimed).
pub async fn stall_once_past(site: Site, one_in: u64, floor: std::time::Duration, max: std::time::Duration) {
    // On the real stores (`stall_process`) the runner that takes over needs seconds, not the
    // simulation's milliseconds, to recover and reopen: the stall may last up to 30 s longer.
    let max = if process_wide() {
        max + std::time::Duration::from_secs(30)
    } else {
        max
    };
    if let Some(x) = fire_once(site, one_in) {
        sleep_drawn_from(x, floor, max).await;
    }
}

/// `stall_once` that ends early when the simulation calls `wake(site)`: a window that hurts
/// only while another process is between two of its steps (a recovery between its rebuild and
/// its reopen), which a drawn sleep would mostly miss.
pub async fn stall_once_until_woken(site: Site, one_in: u64, max: std::time::Duration) {
    let Some(x) = fire_once(site, one_in) else { return };
    // Registered before the first await: the simulation wakes it only after its own sleeps.
    let woken = std::sync::Arc::new(tokio::sync::Notify::new());
    WAKERS.with(|w| w.borrow_mut().push((site, woken.clone())));
    tokio::select! {
        _ = sleep_drawn(x, max) => {}
        _ = woken.notified() => {}
    }
    WAKERS.with(|w| w.borrow_mut().retain(|(_, n)| !std::sync::Arc::ptr_eq(n, &woken)));
}

/// End the sleep of a process at the long fault point `site` (`stall_once_until_woken`).
pub fn wake(site: Site) {
    WAKERS.with(|w| {
        for (_, n) in w.borrow().iter().filter(|(s, _)| *s == site) {
            n.notify_one();
        }
    });
}

/// Whether the long fault point `site` fires now (at most once per run, one call in `one_in`):
/// the draw that sizes its sleep, after the simulation was told (`on_long_stall`).
fn fire_once(site: Site, one_in: u64) -> Option<u64> {
    let process = process_wide();
    let fired = if process {
        PROCESS_FIRED.load(Ordering::Relaxed)
    } else {
        FIRED.with(|f| f.get())
    };
    if !ENABLED || fired & site.bit() != 0 {
        return None;
    }
    let x = draw()?;
    if x % one_in != 0 {
        return None;
    }
    if process {
        // Two tasks may race to the same site: one fires.
        if PROCESS_FIRED.fetch_or(site.bit(), Ordering::Relaxed) & site.bit() != 0 {
            return None;
        }
    } else {
        FIRED.with(|f| f.set(f.get() | site.bit()));
    }
    ON_LONG_STALL.with(|h| h.borrow().as_ref().map(|f| f(site)));
    Some(x)
}
