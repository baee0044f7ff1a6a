import faulthandler, json, os, runpy, sys, time, traceback
faulthandler.enable(all_threads=True)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    raise
except Exception as e:
    _f = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if _f:
        with open(_f, "w") as _fp:
            json.dump({"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}, _fp)
    raise
