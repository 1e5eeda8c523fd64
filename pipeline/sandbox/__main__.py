"""`python -m pipeline.sandbox --dir DIR`: serve every sandbox service until SIGTERM."""

from pipeline.sandbox.launcher import main

raise SystemExit(main())
