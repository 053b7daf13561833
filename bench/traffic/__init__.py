"""A traffic model of a busy fleet (issue 51): model.py the schedule (pure data), driver.py its replay."""
