//! A slow-down after repeated failed sign-ins. Tokens are long and random, so guessing one is
//! hopeless anyway; but an address that sends wrong tokens without end costs a check each
//! (a read of the tokens bucket) and fills the audit trail. So each address may fail
//! [`FREE`] times; after that, every further failure makes it wait before its next attempt is
//! looked at: 1 s, then twice as long each time, up to [`LONGEST`]. Waiting attempts are
//! refused (`429` with `Retry-After`) without a check. A success forgets the address.
//!
//! Counted per peer address, as the server sees it: behind a proxy every browser shares the
//! proxy's, so a wrong-token loop there slows everyone down — which is why the wait is short.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failures an address may have before it must wait.
pub const FREE: u32 = 5;
/// The longest wait.
pub const LONGEST: Duration = Duration::from_secs(60);
/// How long an address's failures are remembered after its last one.
const MEMORY: Duration = Duration::from_secs(15 * 60);
/// The most addresses kept (the one that failed longest ago goes first beyond it).
const MOST: usize = 10_000;

/// One address's failures.
#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Failures {
    /// When the address may try again.
    fn until(&self) -> Instant {
        match self.count.checked_sub(FREE) {
            None => self.last,
            Some(over) => {
                let wait = Duration::from_secs(1u64 << over.min(6)).min(LONGEST);
                self.last + wait
            }
        }
    }
}

/// The failed sign-ins of this node, by address.
#[derive(Clone, Debug, Default)]
pub struct Throttle(Arc<Mutex<HashMap<IpAddr, Failures>>>);

impl Throttle {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long `peer` must still wait before an attempt of its is checked, if at all.
    pub fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let until = self.map().get(&peer)?.until();
        (until > now).then(|| until - now)
    }

    /// Counts a failed attempt of `peer`.
    pub fn failed(&self, peer: IpAddr, now: Instant) {
        let mut map = self.map();
        if !map.contains_key(&peer) && map.len() >= MOST {
            map.retain(|_, f| now.saturating_duration_since(f.until()) < MEMORY);
            if map.len() >= MOST {
                if let Some(oldest) = map.iter().min_by_key(|(_, f)| f.last).map(|(ip, _)| *ip) {
                    map.remove(&oldest);
                }
            }
        }
        let entry = map.entry(peer).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now.saturating_duration_since(entry.until()) >= MEMORY {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
    }

    /// Forgets `peer`'s failures (it signed in).
    pub fn succeeded(&self, peer: IpAddr) {
        self.map().remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 8));

    #[test]
    fn the_first_failures_are_free_then_each_doubles_the_wait_up_to_a_minute() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for _ in 0..FREE - 1 {
            throttle.failed(PEER, start);
            assert_eq!(throttle.wait(PEER, start), None);
        }
        let mut now = start;
        for expected in [1, 2, 4, 8, 16, 32, 60, 60] {
            throttle.failed(PEER, now);
            assert_eq!(
                throttle.wait(PEER, now),
                Some(Duration::from_secs(expected))
            );
            // Another address is not slowed down.
            assert_eq!(throttle.wait(OTHER, now), None);
            now += Duration::from_secs(expected);
            assert_eq!(throttle.wait(PEER, now), None);
        }
        // A success forgets it all.
        throttle.succeeded(PEER);
        throttle.failed(PEER, now);
        assert_eq!(throttle.wait(PEER, now), None);
    }

    #[test]
    fn failures_are_forgotten_a_quarter_of_an_hour_after_the_wait() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for _ in 0..FREE {
            throttle.failed(PEER, start);
        }
        assert!(throttle.wait(PEER, start).is_some());
        let later = start + Duration::from_secs(1) + MEMORY;
        throttle.failed(PEER, later);
        assert_eq!(throttle.wait(PEER, later), None);
    }

    #[test]
    fn the_addresses_kept_are_bounded() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for i in 0..(MOST as u32 + 10) {
            throttle.failed(IpAddr::V4(i.into()), now + Duration::from_millis(i.into()));
        }
        assert_eq!(throttle.map().len(), MOST);
        // The newest is kept.
        assert!(throttle
            .map()
            .contains_key(&IpAddr::V4((MOST as u32 + 9).into())));
    }
}
