//! The dead-letter topic on Apache Kafka, as `seckill admin dead-letters` reads and purges it:
//! every letter with the reason and origin its consumer wrote, page after page across partitions,
//! and a purge that deletes below the positions given and nothing else.

use super::{kafka, unique_id};
use seckill_core::ports::{DeadLetter, OrderBus, OrderSource};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_read_page_by_page_and_purged_below_a_position() {
    let Some(bus) = kafka("dlq").await else {
        return;
    };
    const N: usize = 7;
    for i in 0..N {
        bus.publish_raw(&format!("key-{i}"), format!("junk {i}").as_bytes())
            .await
            .unwrap();
    }
    let mut source = bus.subscribe(&format!("dlq-{}", unique_id())).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < N {
        assert!(Instant::now() < deadline, "{} of {N} records polled", got.len());
        got.extend(source.poll(N).await.unwrap());
    }
    for d in &got {
        source
            .dead_letter(d, &format!("reason of {}", d.key))
            .await
            .unwrap();
    }
    source.commit(&got).await.unwrap();

    // Page by page, two at a time, until the end of every partition.
    let topic = &bus.config().topic;
    let (mut from, mut read, mut first): (_, Vec<DeadLetter>, Option<_>) = (Some((0, 0)), Vec::new(), None);
    while let Some(at) = from {
        let page = bus.dead_letters(at, 2).await.unwrap();
        assert!(page.letters.len() <= 2);
        assert_eq!(page.total, N as u64);
        first.get_or_insert(page.ends.clone());
        read.extend(page.letters);
        from = page.next;
    }
    let ends = first.unwrap();
    assert_eq!(read.len(), N, "{read:?}");
    for d in &got {
        let letter = read
            .iter()
            .find(|l| l.key == d.key)
            .expect("every record was dead-lettered");
        assert_eq!(letter.reason, format!("reason of {}", d.key));
        assert_eq!(letter.origin, format!("{topic}/{}@{}", d.partition, d.offset));
        assert_eq!(letter.payload, d.payload);
    }
    let per_partition: BTreeMap<u32, usize> = read.iter().fold(BTreeMap::new(), |mut m, l| {
        *m.entry(l.partition).or_default() += 1;
        m
    });
    assert!(
        per_partition.len() > 1,
        "the letters span partitions: {per_partition:?}"
    );
    // One letter by its position, as `show` reads it.
    let one = &read[read.len() - 1];
    let shown = bus.dead_letters((one.partition, one.offset), 1).await.unwrap();
    assert_eq!(shown.letters.first(), Some(one));

    // Purge one partition below its end: those letters go, the others stay.
    let (p, n) = per_partition.iter().next().map(|(p, n)| (*p, *n)).unwrap();
    let end = ends.iter().find(|(q, _)| *q == p).unwrap().1;
    assert_eq!(bus.purge_dead_letters(&[(p, end)]).await.unwrap(), n as u64);
    let after = bus.dead_letters((0, 0), 100).await.unwrap();
    assert_eq!(after.total, (N - n) as u64);
    assert!(after.letters.iter().all(|l| l.partition != p), "{after:?}");
    assert_eq!(bus.purge_dead_letters(&ends).await.unwrap(), (N - n) as u64);
    assert_eq!(bus.dead_letters((0, 0), 100).await.unwrap().total, 0);
}
