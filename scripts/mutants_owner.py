"""The deliberate bugs of ``make mutants`` in the controller's owner (controller/state.py): the
changes heard while deciding, and who a change wakes (scripts/mutants.py runs them)."""

from __future__ import annotations

from mutant import ONCHANGE, STATE, Mutant

MUTANTS = [
    Mutant(
        "heard_inside_decision",
        "a change of the ledger is applied as it is heard, inside the decision that made it (re-entry)",
        (
            (
                STATE,
                "        if self._deciding:\n            return\n        self._deciding += 1\n",
                "        self._deciding += 1\n",
            ),
        ),
    ),
    Mutant(
        "heard_left_unapplied",
        "the changes heard during a decision are not applied when it ends (only at the next change)",
        (
            (
                STATE,
                "            self._deciding -= 1\n            self._apply_heard()\n",
                "            self._deciding -= 1\n",
            ),
        ),
    ),
    Mutant(
        "queue_woken_by_every_change",
        "every change of any deployment wakes the queued starts (a preparation's progress, an edit)",
        (
            (
                ONCHANGE,
                '    dep = change.deployment\n    if change.kind == "released":\n',
                "    dep = change.deployment\n    if True:\n",
            ),
        ),
    ),
]
