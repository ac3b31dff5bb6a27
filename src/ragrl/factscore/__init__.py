"""Factuality of a text against a knowledge base (KnowRL's FActScore reward), two backends.

One interface (`FactScorer.score_many([(topic, text), ...])` → `FactScore` per item):
- `embedded` (ragrl.factscore.embedded): atomic facts are the text's sentences / clauses; a fact is
  supported when the synthetic world's sentence templates parse it into a triple that the topic's
  KB document states. No model, deterministic: the embedded default's reward.
- `paper` (ragrl.factscore.paper): atomic facts from an OpenAI-compatible endpoint (KnowRL's
  prompt, in resources/knowrl/prompts/), verified against the topic document's top-k passages by
  an NLI model or by the LLM, as KnowRL does.

Both cache facts per text and verdicts per (topic, fact), and a topic without a KB document costs
that item its score (logged once per topic), never the batch.
"""

from ragrl.factscore.core import FactScore, FactScorer, FactVerdict, length_penalty

__all__ = ["FactScore", "FactScorer", "FactVerdict", "length_penalty"]
