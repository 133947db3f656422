"""Desktop scenarios (Windows, macOS, Ubuntu): menus, dialogs, file lists, drags, shortcuts."""

from __future__ import annotations

from data_gen.sample_corpus._base import (
    SENTENCES,
    WORDS,
    Ctx,
    Episode,
    at,
    file_names,
    step,
    terminate,
)
from data_gen.sample_corpus.screens import Box, Screen, desktop, font, status_bar


def _app_name(platform: str, kind: str) -> str:
    table = {
        "editor": {"windows": "Notepad", "mac": "TextEdit", "ubuntu": "Text Editor"},
        "files": {"windows": "File Explorer", "mac": "Finder", "ubuntu": "Files"},
    }
    return table[kind][platform]


def _document(scr: Screen, box: Box, lines: list[str], selected: bool = False) -> None:
    for i, line in enumerate(lines):
        y = box[1] + scr.u(24) + i * scr.u(24)
        if selected:
            width = scr.draw.textlength(line, font=font(scr.u(14)))
            scr.rect(
                (box[0] + scr.u(14), y - scr.u(10), box[0] + scr.u(18) + width, y + scr.u(10)),
                "#9ec5f0",
            )
        scr.text((box[0] + scr.u(16), y), line, 14, "#111111")
    area = (box[0], box[1], box[2], box[1] + scr.u(24) * (len(lines) + 1))
    scr.element("Document", "document", area, "")  # the lines are drawn, not the name


def save_as(ctx: Ctx) -> Episode:
    """Editor: File menu → Save As… → type the name and press Enter in the dialog."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "editor")
    name = f"{rng.choice(WORDS)}_{rng.randint(2, 30)}.txt"
    lines = rng.sample(SENTENCES, 5)

    def frame(
        k: int,
        title: str,
        status: str,
        menu: bool = False,
        dialog: str | None = None,
        focused: bool = False,
    ):
        scr, content = desktop(p, w, h, ctx.clock(k), f"{title} - {app}")
        content = status_bar(scr, content, status)
        _document(scr, content, lines)
        if menu:
            f = scr.find("File").box
            scr.dropdown(f[0], f[3], ["New", "Open...", "Save", "Save As...", "Exit"])
        if dialog is not None:
            body = scr.dialog(520, 260, "Save As")
            scr.rows(
                (body[0], body[1], body[2], body[1] + scr.u(110)),
                ["Desktop", "Documents", "Downloads"],
                0,
                34,
                role="folder",
                selected="Documents",
            )
            y = body[1] + scr.u(126)
            scr.text((body[0], y + scr.u(14)), "File name:", 13)
            scr.field(
                (body[0] + scr.u(90), y, body[2], y + scr.u(28)), "File name", dialog, focused
            )
            scr.button(
                (body[2] - scr.u(200), body[3] - scr.u(34), body[2] - scr.u(110), body[3]),
                "Save",
                primary=True,
            )
            scr.button((body[2] - scr.u(96), body[3] - scr.u(34), body[2], body[3]), "Cancel")
        return scr

    s0 = frame(0, "Untitled", "Ln 1, Col 1")
    s1 = frame(1, "Untitled", "Ln 1, Col 1", menu=True)
    s2 = frame(2, "Untitled", "Ln 1, Col 1", dialog="")
    # The dialog opens with the folder list active: the name field takes typing only once
    # clicked (a separate focus step, as in the web search).
    s3 = frame(3, "Untitled", "Ln 1, Col 1", dialog="", focused=True)
    s4 = frame(4, name, f"Saved {name}")
    ep = Episode(
        "save_as",
        p,
        app,
        [
            f"Save the current document as {name}.",
            f"Use Save As to store this note under the name {name}.",
            f"In {app}, save the open text with the file name {name}.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"{app} shows an unsaved document titled Untitled. Saving under a new name starts "
            "from the File menu in the menu bar.",
            "Open the File menu in the menu bar",
            at(ctx, s0, "click", "File"),
        ),
        step(
            s1,
            "The File menu is open and lists Save As..., which lets me choose the name.",
            "Click Save As... in the File menu",
            at(ctx, s1, "click", "Save As..."),
        ),
        step(
            s2,
            "The Save As dialog is open; the File name field is empty and has no caret yet.",
            "Click the File name field",
            at(ctx, s2, "click", "File name"),
        ),
        step(
            s3,
            "The File name field is focused and empty.",
            f"Type {name} into the file name field and press Enter to save",
            f"write(message={name!r})",
            "press(keys='enter')",
        ),
        step(
            s4,
            f"The title bar now reads {name}, so the document was saved.",
            "The document is saved, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def open_file(ctx: Ctx) -> Episode:
    """File manager: wait for the folder to load, scroll, open a file and report its size.

    The first screen shows a spinner in place of the list (a ``wait`` step); an absent file
    makes the episode fail.
    """
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "files")
    files = file_names(rng, 34)
    sizes = [f"{rng.randint(2, 900)} KB" for _ in files]
    missing = rng.random() < 0.3
    target = (
        "quarterly_review.pptx" if missing else files[rng.randint(len(files) // 2, len(files) - 2)]
    )

    def frame(k: int, offset: int, opened: bool = False, loading: bool = False):
        scr, content = desktop(p, w, h, ctx.clock(k), f"Documents - {app}")
        content = status_bar(scr, content, "Loading..." if loading else f"{len(files)} items")
        box = (
            content[0] + scr.u(10),
            content[1] + scr.u(10),
            content[2] - scr.u(10),
            content[3] - scr.u(10),
        )
        if loading:
            # A large folder on a slow drive: the list is empty until the listing arrives.
            scr.rect(box, "#ffffff", outline="#c8c8c8")
            scr.spinner((box[0] + box[2]) // 2, (box[1] + box[3]) // 2, "Loading items...")
            return scr
        scr.rows(box, files, offset, 30, role="file", details=sizes)
        if opened:
            body = scr.dialog(420, 200, f"{target} Properties")
            scr.text((body[0], body[1] + scr.u(30)), f"Name: {target}", 13)
            scr.text((body[0], body[1] + scr.u(60)), f"Size: {sizes[files.index(target)]}", 13)
            scr.button((body[2] - scr.u(90), body[3] - scr.u(34), body[2], body[3]), "OK", True)
        return scr

    busy = frame(0, 0, loading=True)
    s0 = frame(1, 0)
    visible = sum(1 for e in s0.elements if e.role == "file")
    last = max(0, len(files) - visible)
    shift = last if missing else min(last, files.index(target) - visible + 3)
    s1 = frame(2, shift)
    ep = Episode(
        "open_file",
        p,
        app,
        [
            f"Open {target} from the Documents folder and tell me its size.",
            f"What is the size of the file {target} in Documents?",
            f"Find {target} in {app} and report how large it is.",
        ],
    )
    # pyautogui convention: negative clicks scroll the view down (one click = one row here).
    scroll = at(ctx, s0, "scroll", "list", f"clicks={-shift}")
    ep.steps = [
        step(
            busy,
            f"{app} is still reading the Documents folder; a spinner shows instead of the files.",
            "Wait 2 seconds for the folder contents to load",
            "wait(seconds=2)",
        ),
        step(
            s0,
            f"The Documents folder lists {len(files)} files sorted by name; {target} is "
            "not visible yet, so I need to scroll down the list.",
            "Scroll down the file list to reveal more files",
            scroll,
        ),
    ]
    if missing:
        ep.outcome = "failure"
        ep.steps.append(
            step(
                s1,
                f"The list is at its end and {target} is not in the folder.",
                f"Stop, because {target} does not exist in this folder",
                terminate(False, rng, f"{target} is not in Documents"),
            )
        )
        return ep
    s2 = frame(3, shift, opened=True)
    s3 = frame(4, shift, opened=True)
    size = sizes[files.index(target)]
    ep.steps += [
        step(
            s1,
            f"{target} is now visible in the list.",
            f"Double-click {target} to open it",
            at(ctx, s1, "doubleClick", target),
        ),
        step(
            s2,
            f"The properties dialog shows the size {size}.",
            f"Report that the size is {size}",
            f"response(answer={size!r})",
        ),
        step(s3, "The answer has been given.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def drag_file(ctx: Ctx) -> Episode:
    """File manager: wait out a copy progress dialog, then drag the copied file onto a folder.

    The ``wait`` step's screen shows the progress bar and the list without the file; the next
    screen shows the file arrived (``moveTo`` + ``dragTo`` follow).
    """
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "files")
    files = file_names(rng, 8)
    target = rng.choice(files)
    folder = rng.choice(("Archive", "Projects", "Shared"))

    def frame(k: int, items: list[str], status: str, copying: bool = False):
        scr, content = desktop(p, w, h, ctx.clock(k), f"Downloads - {app}")
        content = status_bar(scr, content, status)
        side = (
            content[0] + scr.u(8),
            content[1] + scr.u(8),
            content[0] + scr.u(200),
            content[3] - scr.u(8),
        )
        scr.rows(
            side,
            ["Desktop", "Downloads", "Archive", "Projects", "Shared"],
            0,
            32,
            role="folder",
            selected="Downloads",
        )
        scr.rows(
            (side[2] + scr.u(10), side[1], content[2] - scr.u(8), side[3]),
            items,
            0,
            30,
            role="file",
        )
        if copying:
            body = scr.dialog(440, 170, "Copying files...")
            scr.text((body[0], body[1] + scr.u(22)), f"Copying {target} to Downloads", 13)
            bar = (body[0], body[1] + scr.u(48), body[2], body[1] + scr.u(66))
            scr.progress_bar(bar, 0.6, "Copy progress")
            scr.text((body[0], body[1] + scr.u(84)), "About 2 seconds remaining", 12, "#6b6b6b")
            scr.button((body[2] - scr.u(90), body[3] - scr.u(32), body[2], body[3]), "Cancel")
        return scr

    others = [f for f in files if f != target]
    busy = frame(0, others, "Copying 1 item", copying=True)
    s0 = frame(1, files, f"{len(files)} items")
    s1 = frame(2, others, f"Moved 1 item to {folder}")
    ep = Episode(
        "drag_file",
        p,
        app,
        [
            f"Move {target} from Downloads into the {folder} folder by dragging it.",
            f"Drag the file {target} onto {folder} in the sidebar.",
        ],
    )
    ep.steps = [
        step(
            busy,
            f"{target} is still being copied into Downloads; a progress dialog covers the window.",
            "Wait 2 seconds for the copy to finish",
            "wait(seconds=2)",
        ),
        step(
            s0,
            f"{target} is in the Downloads list and {folder} is in the sidebar.",
            f"Drag {target} onto the {folder} folder in the sidebar",
            at(ctx, s0, "moveTo", target),
            at(ctx, s0, "dragTo", folder),
        ),
        step(
            s1,
            f"The status bar confirms the file was moved to {folder}.",
            "The file has been moved, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def copy_text(ctx: Ctx) -> Episode:
    """Editor: click into the text, select all and copy with positional ``hotkey`` calls."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "editor")
    mod = "command" if p == "mac" else "ctrl"
    lines = rng.sample(SENTENCES, 4)

    def frame(k: int, selected: bool, status: str):
        scr, content = desktop(p, w, h, ctx.clock(k), f"notes.txt - {app}")
        content = status_bar(scr, content, status)
        _document(scr, content, lines, selected)
        return scr

    s0 = frame(0, False, "Ln 1, Col 1")
    s1 = frame(1, False, "Ln 2, Col 8")
    s2 = frame(2, True, f"{len(lines)} lines selected")
    s3 = frame(3, True, "Copied to clipboard")
    ep = Episode(
        "copy_text",
        p,
        app,
        [
            "Copy the whole text of notes.txt to the clipboard.",
            "Select everything in the open note and copy it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The note is open; the text area needs focus before the shortcut works.",
            "Click inside the document text to focus it",
            at(ctx, s0, "click", "Document"),
        ),
        step(
            s1,
            "The caret is in the document.",
            "Select all text with the keyboard shortcut",
            f"hotkey({mod!r}, 'a')",
        ),
        step(s2, "All lines are highlighted.", "Copy the selected text", f"hotkey({mod!r}, 'c')"),
        step(
            s3,
            "The status bar says the text was copied.",
            "The text is copied, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


# Context-menu entries per platform: the destructive entry is named the way each system names it.
_CONTEXT_MENU = {
    "windows": ("Open", "Cut", "Copy", "Rename", "Delete", "Properties"),
    "mac": ("Open", "Get Info", "Rename", "Duplicate", "Move to Trash"),
    "ubuntu": ("Open", "Cut", "Copy", "Rename...", "Move to Trash", "Properties"),
}


def delete_file(ctx: Ctx) -> Episode:
    """File manager: right-click a file, pick the delete entry of the context menu."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "files")
    files = file_names(rng, 8)
    target = rng.choice(files)
    menu = _CONTEXT_MENU[p]
    delete = menu[-2] if p != "mac" else menu[-1]

    def frame(k: int, items: list[str], status: str, context: bool = False) -> Screen:
        scr, content = desktop(p, w, h, ctx.clock(k), f"Documents - {app}")
        content = status_bar(scr, content, status)
        box = (content[0] + scr.u(8), content[1] + scr.u(8), content[2] - scr.u(8), content[3])
        scr.rows(box, items, 0, 30, role="file", selected=target if context else None)
        if context:
            x1, y1, x2, y2 = scr.find(target).box
            scr.dropdown(int(x1 + (x2 - x1) * 0.4), int((y1 + y2) / 2), list(menu))
        return scr

    s0 = frame(0, files, f"{len(files)} items")
    s1 = frame(1, files, f"{len(files)} items", context=True)
    s2 = frame(2, [f for f in files if f != target], f"{len(files) - 1} items")
    ep = Episode(
        "delete_file",
        p,
        app,
        [
            f"Delete {target} from Documents using the context menu.",
            f"Right-click {target} and remove it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"{target} is in the Documents list; its context menu has a delete entry.",
            f"Right-click {target} to open its context menu",
            at(ctx, s0, "rightClick", target),
        ),
        step(
            s1,
            f"The context menu of {target} is open.",
            f"Click {delete} in the context menu",
            at(ctx, s1, "click", delete),
        ),
        step(
            s2,
            f"{target} is no longer in the list.",
            "The file is deleted, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def export_pdf(ctx: Ctx) -> Episode:
    """Editor: File → Export as PDF… → pick a folder, click the name field, type, export, wait
    for the progress dialog, open the PDF.

    The export dialog's ``Open PDF`` button is drawn greyed out while the progress bar runs and
    enabled at the same place once it is done, so acting during the wait is visibly premature.
    """
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "editor")
    stem = f"{rng.choice(WORDS)}_{rng.randint(2, 60)}"
    folders = ["Desktop", "Documents", "Downloads", "Projects"]
    folder = rng.choice(folders)
    # Three lines only: the File menu's lower entries then open over blank page, not text.
    lines = rng.sample(SENTENCES, 3)

    def frame(k: int, view: str, picked: str | None = None, name: str = "", focus: bool = False):
        title = f"{stem}.pdf - PDF Viewer" if view == "viewer" else f"notes.txt - {app}"
        if view == "viewer":
            scr, content = desktop(p, w, h, ctx.clock(k), title, menus=())
            page = (content[0] + scr.u(200), content[1] + scr.u(20))
            scr.rect((*page, content[2] - scr.u(200), content[3] - scr.u(20)), "#f4f4f4")
            for i, line in enumerate(lines):
                scr.text((content[0] + scr.u(240), content[1] + scr.u(70 + 28 * i)), line, 14)
            return scr
        scr, content = desktop(p, w, h, ctx.clock(k), title)
        content = status_bar(scr, content, "Ln 1, Col 1")
        _document(scr, content, lines)
        if view == "menu":
            f = scr.find("File").box
            items = ["New", "Open...", "Save", "Print...", "Export as PDF...", "Exit"]
            scr.dropdown(f[0], f[3], items)
            return scr
        if view == "home":
            return scr
        body = scr.dialog(520, 300, "Export as PDF")
        if view in ("busy", "done"):
            msg = "Exporting pages..." if view == "busy" else f"Exported {stem}.pdf to {folder}"
            scr.text((body[0], body[1] + scr.u(30)), msg, 13)
            if view == "busy":
                bar = (body[0], body[1] + scr.u(60), body[2], body[1] + scr.u(80))
                scr.progress_bar(bar, 0.4, "Export progress")
            button = (body[2] - scr.u(230), body[3] - scr.u(34), body[2] - scr.u(110), body[3])
            if view == "busy":
                scr.disabled_button(button, "Open PDF")
            else:
                scr.button(button, "Open PDF", primary=True)
            close = "Cancel" if view == "busy" else "Close"
            scr.button((body[2] - scr.u(96), body[3] - scr.u(34), body[2], body[3]), close)
            return scr
        scr.rows(
            (body[0], body[1], body[2], body[1] + scr.u(140)),
            folders,
            0,
            34,
            role="listitem",
            selected=picked,
        )
        y = body[1] + scr.u(160)
        scr.text((body[0], y + scr.u(14)), "File name:", 13)
        scr.field((body[0] + scr.u(90), y, body[2], y + scr.u(28)), "File name", name, focus)
        scr.button(
            (body[2] - scr.u(200), body[3] - scr.u(34), body[2] - scr.u(110), body[3]),
            "Export",
            primary=True,
        )
        scr.button((body[2] - scr.u(96), body[3] - scr.u(34), body[2], body[3]), "Cancel")
        return scr

    s0, s1 = frame(0, "home"), frame(1, "menu")
    s2 = frame(2, "dialog")
    s3 = frame(3, "dialog", folder)
    s4 = frame(4, "dialog", folder, focus=True)
    s5 = frame(5, "dialog", folder, f"{stem}.pdf", focus=True)
    s6, s7, s8 = frame(6, "busy"), frame(7, "done"), frame(8, "viewer")
    ep = Episode(
        "export_pdf",
        p,
        app,
        [
            f"Export the note as {stem}.pdf into the {folder} folder and open the PDF.",
            f"Save a PDF copy of this document named {stem}.pdf in {folder}, then open it.",
            f"In {app}, export a PDF called {stem}.pdf to {folder} and show it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"{app} shows the note; exporting starts from the File menu.",
            "Open the File menu in the menu bar",
            at(ctx, s0, "click", "File"),
        ),
        step(
            s1,
            "The File menu is open and lists Export as PDF....",
            "Click Export as PDF...",
            at(ctx, s1, "click", "Export as PDF..."),
        ),
        step(
            s2,
            f"The export dialog lists the folders; {folder} is where the PDF goes.",
            f"Click the {folder} folder",
            at(ctx, s2, "click", folder),
        ),
        step(
            s3,
            f"{folder} is selected; the File name field is empty and has no caret.",
            "Click the File name field",
            at(ctx, s3, "click", "File name"),
        ),
        step(
            s4,
            "The File name field has the caret.",
            f"Type {stem}.pdf as the file name",
            f"write(message='{stem}.pdf')",
        ),
        step(s5, "The name is filled in.", "Click Export", at(ctx, s5, "click", "Export")),
        step(
            s6,
            "The export is running: the progress bar is partly filled and Open PDF is greyed out.",
            "Wait 3 seconds for the export to finish",
            "wait(seconds=3)",
        ),
        step(
            s7,
            "The export is done and the Open PDF button is enabled.",
            "Click Open PDF",
            at(ctx, s7, "click", "Open PDF"),
        ),
        step(
            s8,
            f"The PDF viewer shows {stem}.pdf.",
            "The PDF is exported and open, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep
