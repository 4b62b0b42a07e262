"""Driver script for ``spark-submit``: the ``subc`` command line, with Spark set up by spark-submit.

    spark-submit --master yarn --py-files subc.zip "$(python3 -m subc.analysis.submit --path)" \\
        analyze rules.sub --spec spec.p4 --trace /shared/itch/day.itch -o /shared/out

(see docs/pipeline.md, "Running on a cluster").  ``--path`` prints this file's path.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if sys.argv[1:] == ["--path"]:
        print(__file__)
        sys.exit(0)
    from ..cli import main

    main(sys.argv[1:], prog_name="subc")
