"""Build an action plugin's ActionModule as Ansible would for one task (shared by the tests of action plugins)."""
from unittest import mock


def make_action(plugin, args, check_mode=False):
    """An action plugin's ActionModule for a task with these arguments (connection, loader, templar mocked)."""
    task = mock.MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    return plugin.ActionModule(task, mock.MagicMock(), mock.MagicMock(), loader=None, templar=None,
                               shared_loader_obj=None)
