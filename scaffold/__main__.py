try:
    from scaffold.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python imports the command line: nothing was done
    import sys

    sys.stderr.write("error: interrupted; no file was changed: run the command again\n")
    sys.exit(130)

main()
