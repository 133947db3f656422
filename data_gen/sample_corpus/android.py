"""Android scenarios: an alarm in the Clock app, a contact found by swiping a list, an app
installed from the store."""

from __future__ import annotations

from data_gen.sample_corpus._base import (
    APPS,
    PEOPLE,
    Ctx,
    Episode,
    at,
    step,
    terminate,
)
from data_gen.sample_corpus.screens import Box, Screen, phone


def _home(scr: Screen, box: Box) -> None:
    u = scr.u
    for i, app in enumerate(APPS):
        col, row = i % 4, i // 4
        x = box[0] + u(30) + col * u(124)
        y = box[1] + u(60) + row * u(140)
        scr.rect((x, y, x + u(88), y + u(88)), "#d0bcff", radius=24)
        scr.text_centered((x, y, x + u(88), y + u(88)), app[:2], 26, "#21005d")
        scr.text_centered((x - u(16), y + u(92), x + u(104), y + u(118)), app, 15)
        scr.element(app, "icon", (x, y, x + u(88), y + u(118)))


def set_alarm(ctx: Ctx) -> Episode:
    """Clock app: open it, add an alarm, tap the label field, type a label, save."""
    (w, h), rng = ctx.size, ctx.rng
    hour, minute = rng.choice((6, 7, 8)), rng.choice((0, 15, 30, 45))
    label = rng.choice(("Gym", "Meds", "Standup", "School run", "Call mum"))
    when = f"{hour}:{minute:02d} AM"

    def frame(
        k: int,
        view: str,
        text: str = "",
        alarms: tuple[str, ...] = ("6:00 AM", "9:30 AM"),
        focused: bool = False,
    ):
        scr, box = phone(w, h, ctx.clock(k))
        u = scr.u
        if view == "home":
            _home(scr, box)
            return scr
        scr.text((box[0] + u(24), box[1] + u(40)), "Alarm", 26)
        if view == "new":
            scr.text((box[0] + u(24), box[1] + u(120)), when, 40)
            scr.field(
                (box[0] + u(24), box[1] + u(200), box[2] - u(24), box[1] + u(256)),
                "Label",
                text,
                focused=focused or bool(text),
            )
            scr.button(
                (box[2] - u(240), box[1] + u(300), box[2] - u(140), box[1] + u(350)), "Cancel"
            )
            scr.button(
                (box[2] - u(124), box[1] + u(300), box[2] - u(24), box[1] + u(350)), "Save", True
            )
            return scr
        scr.rows(
            (box[0] + u(16), box[1] + u(80), box[2] - u(16), box[3] - u(140)),
            list(alarms),
            0,
            88,
            role="alarm",
        )
        scr.button((box[2] - u(110), box[3] - u(120), box[2] - u(30), box[3] - u(40)), "+")
        return scr

    s0 = frame(0, "home")
    s1 = frame(1, "list")
    s2 = frame(2, "new")
    s2b = frame(3, "new", focused=True)
    s3 = frame(4, "new", label)
    s4 = frame(5, "list", alarms=("6:00 AM", "9:30 AM", f"{when}  {label}"))
    ep = Episode(
        "set_alarm",
        "android",
        "Clock",
        [
            f"Set an alarm for {when} labelled {label}.",
            f"Create a {when} alarm called {label} in the Clock app.",
            f"Add a new alarm at {when} with the label {label}.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The home screen shows the Clock app icon.",
            "Open the Clock app",
            at(ctx, s0, "click", "Clock"),
        ),
        step(
            s1,
            "The Alarm list is open; the + button adds a new alarm.",
            "Tap the + button to create a new alarm",
            at(ctx, s1, "click", "+"),
        ),
        step(
            s2,
            f"The new alarm is set to {when}; the label is still empty.",
            "Tap the Label field",
            at(ctx, s2, "click", "Label"),
        ),
        step(
            s2b,
            "The Label field has the caret.",
            f"Type {label} as the alarm label",
            f"write(message={label!r})",
        ),
        step(s3, "The label is filled in.", "Tap Save", at(ctx, s3, "click", "Save")),
        step(
            s4,
            f"The list now contains the {when} alarm labelled {label}.",
            "The alarm is set, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def _contacts_frame(
    ctx: Ctx, people: list[str], person: str, number: str, k: int, view: str, offset: int = 0
) -> Screen:
    """Screen ``k`` of the contacts scenario: home, the loading splash, the list (scrolled by
    ``offset``), a contact."""
    scr, box = phone(*ctx.size, ctx.clock(k))
    u = scr.u
    if view == "home":
        _home(scr, box)
    elif view == "splash":
        # The app's splash: its name on top and a spinner while the contact list syncs.
        scr.text_centered((box[0], box[1] + u(120), box[2], box[1] + u(180)), "Contacts", 30)
        scr.spinner((box[0] + box[2]) // 2, (box[1] + box[3]) // 2, "Loading contacts...")
    elif view == "list":
        scr.text((box[0] + u(24), box[1] + u(36)), "Contacts", 26)
        scr.rows(
            (box[0] + u(8), box[1] + u(72), box[2] - u(8), box[3] - u(8)),
            people,
            offset,
            64,
            role="contact",
        )
    else:
        scr.text((box[0] + u(24), box[1] + u(60)), person, 28)
        scr.text((box[0] + u(24), box[1] + u(120)), f"Mobile {number}", 18)
        scr.button(
            (box[0] + u(24), box[1] + u(160), box[0] + u(164), box[1] + u(210)), "Call", True
        )
    return scr


def _list_swipe(scr: Screen, rows: int, size: tuple[int, int]) -> tuple[str, str]:
    """A from/to swipe that moves the finger up by exactly ``rows`` list rows."""
    w, h = size
    lst = scr.find("list").box
    fy, ty = 0.8, 0.8 - rows * scr.u(64) / h
    fx = round((lst[0] + lst[2]) / 2 / w, 4)
    return f"swipe(from_coord=[{fx}, {fy}], to_coord=[{fx}, {round(ty, 4)}])", "list"


def find_contact(ctx: Ctx) -> Episode:
    """Contacts: open the app, wait out its splash, swipe the list (from/to), read a number."""
    rng = ctx.rng
    people = sorted(rng.sample(PEOPLE, 20))
    missing = rng.random() < 0.25
    person = "Zack Tremont" if missing else people[rng.randint(12, 19)]
    phones = [f"+1 555 01{rng.randint(10, 99)}" for _ in people]
    number = "" if missing else phones[people.index(person)]

    def frame(k: int, view: str, offset: int = 0) -> Screen:
        return _contacts_frame(ctx, people, person, number, k, view, offset)

    s0 = frame(0, "home")
    splash = frame(1, "splash")
    s1 = frame(2, "list")
    shift = len(people) - sum(1 for e in s1.elements if e.role == "contact")
    # The finger moves up by exactly `shift` rows, so the next screen shows the list that far down.
    s2 = frame(3, "list", shift)
    ep = Episode(
        "find_contact",
        "android",
        "Contacts",
        [
            f"Look up the mobile number of {person} in Contacts.",
            f"What is {person}'s phone number?",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The home screen is visible.",
            "Open the Contacts app",
            "open_app(app_name='Contacts')",
        ),
        step(
            splash,
            "Contacts is still starting: its splash screen shows a spinner and no list yet.",
            "Wait 2 seconds for the contact list to load",
            "wait(seconds=2)",
        ),
        step(
            s1,
            f"The contact list is alphabetical and {person} is further down.",
            "Swipe up on the list to scroll down",
            _list_swipe(s1, shift, ctx.size),
        ),
    ]
    if missing:
        ep.outcome = "failure"
        ep.steps += [
            step(
                s2,
                f"The end of the list is reached and {person} is not there.",
                "Go back, the contact does not exist",
                "navigate_back()",
            ),
            step(
                frame(4, "home"),
                "Back on the home screen; the contact could not be found.",
                "Stop, the contact is not saved",
                terminate(False, rng),
            ),
        ]
        return ep
    s3, s4 = frame(4, "detail"), frame(5, "detail")
    ep.steps += [
        step(s2, f"{person} is now visible.", f"Tap {person}", at(ctx, s2, "click", person)),
        step(
            s3,
            f"The contact page shows the number {number}.",
            f"Answer {number}",
            f"response(answer={number!r})",
        ),
        step(s4, "The number has been reported.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def delete_alarm(ctx: Ctx) -> Episode:
    """Clock: long-press an alarm to select it, delete it from the selection bar."""
    rng = ctx.rng
    alarms = sorted(rng.sample(("5:45 AM", "6:00 AM", "6:30 AM", "7:15 AM", "8:00 AM"), 4))
    target = rng.choice(alarms)

    def frame(k: int, items: list[str], selected: str | None = None) -> Screen:
        scr, box = phone(*ctx.size, ctx.clock(k))
        u = scr.u
        if selected is None:
            scr.text((box[0] + u(24), box[1] + u(40)), "Alarm", 26)
        else:
            scr.rect((box[0], box[1], box[2], box[1] + u(72)), "#e8def8")
            scr.text((box[0] + u(24), box[1] + u(36)), "1 selected", 22)
            scr.button((box[2] - u(130), box[1] + u(14), box[2] - u(20), box[1] + u(58)), "Delete")
        scr.rows(
            (box[0] + u(16), box[1] + u(80), box[2] - u(16), box[3] - u(140)),
            items,
            0,
            88,
            role="alarm",
            selected=selected,
        )
        return scr

    rest = [a for a in alarms if a != target]
    s0, s1, s2 = frame(0, alarms), frame(1, alarms, target), frame(2, rest)
    ep = Episode(
        "delete_alarm",
        "android",
        "Clock",
        [
            f"Delete the {target} alarm.",
            f"Remove my {target} alarm from the Clock app.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"The alarm list shows the {target} alarm; a long press selects it.",
            f"Long-press the {target} alarm to select it",
            at(ctx, s0, "long_press", target, tail="duration=1"),
        ),
        step(
            s1,
            "The alarm is selected and a Delete button appeared in the top bar.",
            "Tap Delete",
            at(ctx, s1, "click", "Delete"),
        ),
        step(
            s2,
            f"The {target} alarm is gone from the list.",
            "The alarm is deleted, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


STORE_APPS = (
    "Notely",
    "FitTrack",
    "BudgetBee",
    "PhotoVault",
    "TransitNow",
    "RecipeBox",
    "SleepWell",
    "LinguaPal",
)


def install_app(ctx: Ctx) -> Episode:
    """Store: tap the search field, type the app's name, pick it from the results, install,
    wait for the progress bar, open it.

    While installing, the ``Open`` button is drawn greyed out where it becomes enabled after
    the wait; the results list is short, so the app page's button sits on blank screen there.
    """
    (w, h), rng = ctx.size, ctx.rng
    apps = rng.sample(STORE_APPS, 4)
    target = rng.choice(apps)

    def frame(k: int, view: str, query: str = "", focus: bool = False) -> Screen:
        scr, box = phone(w, h, ctx.clock(k))
        u = scr.u
        if view == "welcome":
            scr.text_centered((box[0], box[1] + u(200), box[2], box[1] + u(260)), target, 30)
            scr.text_centered(
                (box[0], box[1] + u(280), box[2], box[1] + u(320)), "Welcome! Let's get started", 16
            )
            return scr
        if view in ("home", "results"):
            scr.field(
                (box[0] + u(24), box[1] + u(20), box[2] - u(24), box[1] + u(76)),
                "Search apps",
                query,
                focus,
            )
        if view == "home":
            scr.text((box[0] + u(24), box[1] + u(120)), "Top charts", 20)
            return scr
        if view == "results":
            scr.rows(
                (box[0] + u(16), box[1] + u(100), box[2] - u(16), box[1] + u(100) + u(96) * 4),
                apps,
                0,
                96,
                role="listitem",
            )
            return scr
        scr.text((box[0] + u(24), box[1] + u(60)), target, 28)
        scr.text((box[0] + u(24), box[1] + u(110)), "4.5 stars  ·  1M+ downloads", 15, "#49454f")
        button = (box[0] + u(24), box[1] + u(600), box[2] - u(24), box[1] + u(660))
        if view == "page":
            scr.button(button, "Install", primary=True)
        elif view == "installing":
            scr.progress_bar(
                (box[0] + u(24), box[1] + u(540), box[2] - u(24), box[1] + u(556)),
                0.5,
                "Installing",
            )
            scr.disabled_button(button, "Open")
        else:
            scr.button(button, "Open", primary=True)
        return scr

    s0, s1 = frame(0, "home"), frame(1, "home", focus=True)
    s2 = frame(2, "results", target)
    s3, s4, s5, s6 = (
        frame(k, v) for k, v in ((3, "page"), (4, "installing"), (5, "ready"), (6, "welcome"))
    )
    ep = Episode(
        "install_app",
        "android",
        "Store",
        [
            f"Install {target} from the store and open it.",
            f"Get the {target} app and launch it once it is installed.",
            f"Download {target} from the store, then open the app.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The store's search field is empty and has no caret.",
            "Tap the Search apps field",
            at(ctx, s0, "click", "Search apps"),
        ),
        step(
            s1,
            "The search field has the caret.",
            f"Type {target} and press Enter to search",
            f"write(message={target!r})",
            "press(keys='enter')",
        ),
        step(
            s2,
            f"The results list {target} among similar apps.",
            f"Tap {target} in the results",
            at(ctx, s2, "click", target),
        ),
        step(
            s3,
            f"The page of {target} has an Install button.",
            "Tap Install",
            at(ctx, s3, "click", "Install"),
        ),
        step(
            s4,
            "The app is installing: the progress bar is half full and Open is greyed out.",
            "Wait 3 seconds for the installation to finish",
            "wait(seconds=3)",
        ),
        step(
            s5,
            "The installation finished; Open is enabled.",
            "Tap Open",
            at(ctx, s5, "click", "Open"),
        ),
        step(
            s6,
            f"{target} is open on its welcome screen.",
            "The app is installed and open, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep
