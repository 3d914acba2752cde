//! Connections per client address: a count per IP, taken at accept and
//! given back when the connection ends (the egress proxy uses it too, for
//! the connections still sending their request head).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The per-address counts of one listener.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's count.
#[derive(Debug)]
pub struct AddressSlot {
    owner: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    pub fn new(max: usize) -> PerAddress {
        PerAddress { max, counts: Mutex::new(HashMap::new()) }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for `ip`, or `None` when it holds `max` already. An
    /// IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let ip = ip.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot { owner: self.clone(), ip })
    }

    /// Connections open from `ip` now.
    pub fn held(&self, ip: IpAddr) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_max_slots_and_others_are_apart() {
        let caps = Arc::new(PerAddress::new(2));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let one = caps.try_acquire(a).unwrap();
        let _two = caps.try_acquire(a).unwrap();
        assert!(caps.try_acquire(a).is_none(), "a third from one address is refused");
        // The mapped form is the same address.
        assert!(caps.try_acquire("::ffff:127.0.0.2".parse().unwrap()).is_none());
        assert!(caps.try_acquire(b).is_some(), "another address is not affected");
        drop(one);
        assert!(caps.try_acquire(a).is_some(), "a slot given back is free again");
        assert_eq!(caps.held(b), 0, "a dropped slot leaves no count");
    }
}
