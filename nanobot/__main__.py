from nanobot.entry import main

main()
