from nanograph.cli import main

raise SystemExit(main())
