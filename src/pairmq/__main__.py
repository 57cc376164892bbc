from pairmq.cli import main

main()
