//! Zeroed, 64-byte-aligned runs of memory for the index buckets and the row arena.
//!
//! A table of millions of rows is read at random, so with 4 KiB pages nearly every access
//! also misses the TLB. Runs of 2 MiB or more therefore come from an anonymous mapping
//! aligned to 2 MiB and advised for transparent huge pages (honoured where the kernel's THP
//! mode is `always` or `madvise`); on this machine that alone took a random gather over
//! 1.3 GB from ~20M to 28-50M rows/s, depending on the run. Smaller runs live on the heap,
//! aligned by hand: a PS holds tables x 64 shards x (index + a few chunks) of them, and one
//! mapping each would approach the kernel's limit of 65,530 mappings per process.

use memmap2::{Advice, MmapMut};

const HUGE_PAGE: usize = 2 << 20;
/// Words in a cache line.
const LINE_WORDS: usize = 8;

/// Zeroed, 64-byte-aligned memory: a heap allocation, or for 2 MiB and more an anonymous mapping advised for transparent huge pages.
pub struct Region {
    storage: Storage,
    /// Words from the start of the storage to the aligned start of the region.
    offset: usize,
    len: usize,
}

enum Storage {
    Heap(Vec<u64>),
    Mapped(MmapMut),
}

impl Region {
    /// `len` zeroed words. Mapped memory is committed page by page as it is first written.
    pub fn zeroed(len: usize) -> Self {
        if len * 8 >= HUGE_PAGE
            && let Some(region) = Self::mapped(len)
        {
            return region;
        }
        // No mapping (or a small run): the heap, like any Vec, aborts if memory runs out.
        let heap = vec![0u64; len + LINE_WORDS - 1];
        let misalignment = (heap.as_ptr() as usize / 8) % LINE_WORDS;
        Self {
            storage: Storage::Heap(heap),
            offset: (LINE_WORDS - misalignment) % LINE_WORDS,
            len,
        }
    }

    fn mapped(len: usize) -> Option<Self> {
        let mut map = MmapMut::map_anon(len * 8 + HUGE_PAGE).ok()?;
        // Refused advice (a kernel without THP) only means small pages: still correct.
        let _ = map.advise(Advice::HugePage);
        let start = map.as_mut_ptr() as usize;
        let offset = (start.next_multiple_of(HUGE_PAGE) - start) / 8;
        Some(Self {
            storage: Storage::Mapped(map),
            offset,
            len,
        })
    }

    /// The memory as words.
    pub fn words(&self) -> &[u64] {
        let range = self.offset..self.offset + self.len;
        match &self.storage {
            Storage::Heap(heap) => &heap[range],
            Storage::Mapped(map) => &bytemuck::cast_slice(&map[..])[range],
        }
    }

    /// The memory as words, writable.
    pub fn words_mut(&mut self) -> &mut [u64] {
        let range = self.offset..self.offset + self.len;
        match &mut self.storage {
            Storage::Heap(heap) => &mut heap[range],
            Storage::Mapped(map) => &mut bytemuck::cast_slice_mut(&mut map[..])[range],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_regions_are_zeroed_aligned_and_writable() {
        for len in [1, 100, HUGE_PAGE / 8 + 3] {
            let mut region = Region::zeroed(len);
            assert_eq!(region.words().len(), len);
            assert!(region.words().iter().all(|w| *w == 0));
            assert_eq!(region.words().as_ptr() as usize % 64, 0);
            region.words_mut()[len - 1] = 7;
            assert_eq!(region.words()[len - 1], 7);
        }
        let large = Region::zeroed(HUGE_PAGE / 8);
        assert_eq!(large.words().as_ptr() as usize % HUGE_PAGE, 0);
    }
}
