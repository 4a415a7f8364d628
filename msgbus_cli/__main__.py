from msgbus_cli.main import main

main()
