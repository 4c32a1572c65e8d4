from volt.train import main

main()
