from pairmq.cli.main import main

main()
