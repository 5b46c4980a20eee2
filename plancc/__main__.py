from plancc.cli import app

app(prog_name="plancc")
