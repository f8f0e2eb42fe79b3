from dociq.cli import main

raise SystemExit(main())
