from genconf.cli.main import main

raise SystemExit(main())
