"""A generator that replays recorded assistant segments (SFT rows) through the rollout engine:
the check that SFT sequences are token for token what the engine would produce."""

from __future__ import annotations


class SegmentGenerator:
    """Replays gold assistant segments: the context so far selects the next mask-1 run of ids."""

    def __init__(self, gold_rows):
        self.next = {}
        for row in gold_rows:
            ids, mask = row["input_ids"], row["assistant_masks"]
            i = 0
            while i < len(ids):
                if mask[i] != 1:
                    i += 1
                    continue
                j = i
                while j < len(ids) and mask[j] == 1:
                    j += 1
                self.next[tuple(ids[:i])] = ids[i:j]
                i = j

    def generate(self, batch, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()):
        return [self.next[tuple(ids)] for ids in batch]
