from bertology.cli import main

main()
