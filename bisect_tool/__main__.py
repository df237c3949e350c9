from bisect_tool.cli import main

if __name__ == "__main__":
    main()
