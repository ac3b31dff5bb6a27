"""Evaluation of a policy on a QA set: rollouts through the same engine as training, per-question
predictions and mean metrics (`ragrl.eval.evaluate`)."""
