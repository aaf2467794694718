"""Host bookkeeping of the paged KV cache (`models/paged.py`): which pages each row holds.

The pool's N pages are split over the decode batch's shards, N / shards each; page 0 of every
shard is its null page (never handed out: free rows and unheld table entries point at it).
A group's prompt pages are shared: the first sample of a prompt admitted to a shard allocates
its full pages (written once from the prefix), every sample of it there references them, and
each gets its own copy of the last partial page (copy-on-write done at admission, since the
sample writes into it at its first step). Pages are allocated as rows grow and returned when a
row ends; shared pages when the last row using them ends.
"""
import numpy as np


class PagePool:
  """Free pages per shard, the page table [slots, pages_per_seq] and what each row holds."""

  def __init__(self, *, num_pages: int, shards: int, slots: int, page_size: int,
               max_len: int):
    if num_pages % shards or slots % shards:
      raise ValueError(f"paged KV: {num_pages} pages and {slots} slots must both split over "
                       f"the {shards} batch shards")
    self.n_local, self.page_size = num_pages // shards, page_size
    self.pages_per_seq = -(-max_len // page_size)
    if self.n_local < self.pages_per_seq + 1:
      raise ValueError(f"paged KV: {self.n_local} pages per shard cannot hold one sequence of "
                       f"{max_len} tokens ({self.pages_per_seq} pages of {page_size}) plus the "
                       "null page")
    self.rows_per_shard = slots // shards
    self.free = [list(range((s + 1) * self.n_local - 1, s * self.n_local, -1))
                 for s in range(shards)]  # popped from the end: lowest page first
    self.table = np.repeat(self._null(np.arange(slots))[:, None], self.pages_per_seq, axis=1
                           ).astype(np.int32)
    self.held = np.zeros((slots,), np.int64)  # table entries [0, held) are the row's pages
    self.own = [[] for _ in range(slots)]     # pages the row alone holds (freed at its end)
    self.prompt_of = [None] * slots
    self.shared = {}                          # (shard, prompt) -> [full prompt pages, rows]
    self.in_use_peak = 0                      # pages held at once, all shards
    self.shard_peak = 0                       # pages held at once by the fullest shard

  def _null(self, rows):
    return (rows // self.rows_per_shard) * self.n_local

  def shard(self, row: int) -> int:
    return row // self.rows_per_shard

  def in_use(self) -> int:
    return sum(self.n_local - 1 - len(f) for f in self.free)

  def peak_frac(self) -> float:
    """The most of one shard's pages (its null page aside) held at once: 1.0 = a shard ran
    out at some point."""
    return self.shard_peak / (self.n_local - 1)

  def _note_peaks(self, shard: int) -> None:
    self.in_use_peak = max(self.in_use_peak, self.in_use())
    self.shard_peak = max(self.shard_peak, self.n_local - 1 - len(self.free[shard]))

  def admit(self, row: int, prompt: int, prompt_len: int):
    """Gives `row` its prompt's pages; returns the page writes [(prompt page, pool page)] the
    insert must make, or None (nothing taken) when the shard lacks the pages for the prompt
    and the first generated token."""
    free, key = self.free[self.shard(row)], (self.shard(row), prompt)
    full, partial = divmod(prompt_len, self.page_size)
    new = key not in self.shared
    if len(free) < (full if new else 0) + 1:  # the partial page or the first new page
      return None
    writes = []
    if new:
      self.shared[key] = [[free.pop() for _ in range(full)], 0]
      writes = list(enumerate(self.shared[key][0]))
    pages, _ = self.shared[key]
    self.shared[key][1] += 1
    self.table[row, :full] = pages
    self.held[row], self.prompt_of[row] = full, key
    if partial:
      page = free.pop()
      self.own[row].append(page)
      self.table[row, full] = page
      self.held[row] = full + 1
      writes.append((full, page))
    self._note_peaks(self.shard(row))
    return writes

  def grow(self, row: int, last_position: int) -> bool:
    """Pages for every position up to last_position; False when the shard runs out."""
    free, need = self.free[self.shard(row)], last_position // self.page_size + 1
    while self.held[row] < need:
      if not free:
        return False
      page = free.pop()
      self.own[row].append(page)
      self.table[row, self.held[row]] = page
      self.held[row] += 1
    self._note_peaks(self.shard(row))
    return True

  def release(self, row: int) -> None:
    """Returns the row's pages (and its prompt's, when it was their last user)."""
    free = self.free[self.shard(row)]
    free.extend(reversed(self.own[row]))
    self.own[row] = []
    key = self.prompt_of[row]
    if key is not None:
      self.shared[key][1] -= 1
      if self.shared[key][1] == 0:
        free.extend(reversed(self.shared.pop(key)[0]))
    self.prompt_of[row], self.held[row] = None, 0
    self.table[row] = self._null(row)
