from msgbus.cli.main import main

main()
