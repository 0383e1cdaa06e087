"""Do the working tree's templates render what the templates of COMMIT render? For moving a
feature into its folder (issue 39) without changing a byte of any generated project.

    python benchmarks/same_output.py COMMIT [--combinations 40] [--seed 0]

Renders every example of generated_examples/ plus random valid combinations of tasks and
features with both, and prints the ones whose files differ (`.scaffold/`, which records the
template fingerprint, aside). Exit status 1 when any differs.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    from template_numbers import templates_at  # beside this file

    from scaffold.answers import Answers
    from scaffold.catalogue import FEATURES, TASKS, resolve_features
    from scaffold.errors import UsageError
    from scaffold.examples import EXAMPLES
    from scaffold.render import render

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--combinations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    combos = list(EXAMPLES.values())
    while len(combos) < len(EXAMPLES) + args.combinations:
        features = rng.sample(list(FEATURES), rng.randint(1, 7))
        try:
            resolve_features(features)
        except UsageError:
            continue
        combos.append((rng.choice(list(TASKS)), features))
    with tempfile.TemporaryDirectory() as tmp:
        old = templates_at(args.commit, Path(tmp))
        differ = 0
        for task, features in combos:
            answers = Answers(project_name="p", task=task, features=list(features))
            before, after = render(answers, templates=old), render(answers)
            paths = sorted(p for p in set(before) | set(after) if not p.startswith(".scaffold/"))
            changed = [p for p in paths if before.get(p) != after.get(p)]
            if changed:
                differ += 1
                print(f"{task} {' '.join(features)}: {', '.join(changed)}")
    print(f"{differ} of {len(combos)} combinations render differently from {args.commit}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
