from bftrainer.cli import main

main()
