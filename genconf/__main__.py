from genconf.cli import main

raise SystemExit(main())
