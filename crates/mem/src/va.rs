//! Address ranges inside a pool's reservation: a first-fit free list with
//! coalescing. Sizes are multiples of the backend granularity, so every
//! range handed out is aligned.

use std::collections::BTreeMap;

#[derive(Debug)]
pub(crate) struct AddressSpace {
    /// start → length of each free range; adjacent ranges are merged.
    free: BTreeMap<u64, u64>,
}

impl AddressSpace {
    pub(crate) fn new(base: u64, size: u64) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        AddressSpace { free }
    }

    /// Takes `size` bytes from the lowest free range that holds them.
    pub(crate) fn take(&mut self, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    /// Gives a range back, merging it with its free neighbours.
    pub(crate) fn give(&mut self, start: u64, size: u64) {
        let (mut start, mut size) = (start, size);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back() {
            debug_assert!(
                prev + plen <= start,
                "double free of address range {start:#x}"
            );
            if prev + plen == start {
                self.free.remove(&prev);
                start = prev;
                size += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            size += nlen;
        }
        self.free.insert(start, size);
    }

    #[cfg(test)]
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&a, &b)| (a, b)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_give_coalesce_back_to_one_range() {
        let mut va = AddressSpace::new(0x1000, 0x10000);
        let a = va.take(0x1000).unwrap();
        let b = va.take(0x2000).unwrap();
        let c = va.take(0x1000).unwrap();
        assert_eq!((a, b, c), (0x1000, 0x2000, 0x4000));
        va.give(b, 0x2000);
        // A hole of 0x2000 is reused first-fit.
        assert_eq!(va.take(0x1000), Some(0x2000));
        va.give(0x2000, 0x1000);
        va.give(a, 0x1000);
        va.give(c, 0x1000);
        assert_eq!(va.ranges(), vec![(0x1000, 0x10000)]);
    }

    #[test]
    fn exhaustion_returns_none() {
        let mut va = AddressSpace::new(0, 0x2000);
        assert!(va.take(0x3000).is_none());
        assert_eq!(va.take(0x2000), Some(0));
        assert!(va.take(0x1000).is_none());
    }
}
