"""Web scenarios: a shop search (results spinner, finger-direction swipe), a contact form, a
slow report, a support ticket with an upload."""

from __future__ import annotations

from data_gen.sample_corpus._base import (
    PEOPLE,
    PRODUCTS,
    Ctx,
    Episode,
    at,
    step,
    terminate,
)
from data_gen.sample_corpus.screens import Box, Screen, browser

RESULT_COUNTS = (3, 4, 5, 10, 10, 10)
"""How many products a search finds (drawn uniformly)."""


def _shop_header(scr: Screen, page: Box, query: str, focused: bool, busy: bool = False) -> None:
    u = scr.u
    scr.rect((page[0], page[1], page[2], page[1] + u(64)), "#232f3e")
    scr.text((u(24), page[1] + u(32)), "ShopLite", 22, "#ffffff")
    scr.element("ShopLite", "link", (u(16), page[1] + u(12), u(130), page[1] + u(52)))
    scr.field(
        (u(180), page[1] + u(16), page[2] - u(260), page[1] + u(48)),
        "Search products",
        query,
        focused,
    )
    search = (page[2] - u(250), page[1] + u(16), page[2] - u(160), page[1] + u(48))
    # While a search runs its button is greyed out, one more sign that the page is busy.
    if busy:
        scr.disabled_button(search, "Search")
    else:
        scr.button(search, "Search", True)
    scr.button((page[2] - u(140), page[1] + u(16), page[2] - u(24), page[1] + u(48)), "Cart (0)")


def _shop_frame(
    ctx: Ctx,
    products: list[tuple[str, str]],
    k: int,
    q: str,
    focused: bool,
    results: int | None,
    offset: int = 0,
    product: tuple[str, str] | None = None,
    loading: bool = False,
) -> Screen:
    """Screen ``k`` of the shop: home, results (scrolled by ``offset``, or still loading) or a
    product page."""
    w, h = ctx.size
    url = "http://shoplite.test/" + (
        f"search?q={q.replace(' ', '+')}" if results is not None or loading else ""
    )
    scr, page = browser(w, h, ctx.clock(k), url, "ShopLite")
    _shop_header(scr, page, q, focused, busy=loading)
    body = (page[0] + scr.u(24), page[1] + scr.u(80), page[2] - scr.u(24), page[3] - scr.u(16))
    if product is not None:
        scr.text((body[0], body[1] + scr.u(30)), product[0], 22)
        scr.text((body[0], body[1] + scr.u(70)), f"Price: {product[1]}", 18, "#b12704")
        scr.button(
            (body[0], body[1] + scr.u(100), body[0] + scr.u(160), body[1] + scr.u(136)),
            "Add to cart",
            True,
        )
    elif loading:
        scr.spinner((body[0] + body[2]) // 2, (body[1] + body[3]) // 2, "Searching...")
    elif results == 0:
        scr.text((body[0], body[1] + scr.u(30)), f'No results for "{q}".', 18)
    elif results is not None:
        scr.rows(
            body,
            [n for n, _ in products],
            offset,
            72,
            role="link",
            details=[pr for _, pr in products],
        )
    else:
        scr.text((body[0], body[1] + scr.u(30)), "Deals of the day", 20)
    return scr


def _shop_found(ctx: Ctx, ep: Episode, products: list[tuple[str, str]], query: str) -> None:
    """The steps after a search that found ``query``: swipe to it (where the list is longer than
    the page), open it, answer the price."""
    rng = ctx.rng

    def frame(k: int, **kw) -> Screen:
        return _shop_frame(ctx, products, k, query, False, **kw)

    s2 = frame(3, results=len(products))
    visible = sum(1 for e in s2.elements if e.role == "link" and e.label != "ShopLite")
    price = dict(products)[query]
    if products.index((query, price)) < visible:
        # A short list: the product is on the first page of results.
        k = 4
        ep.steps.append(
            step(
                s2,
                f"{query} is among the results.",
                f"Open the result {query}",
                at(ctx, s2, "click", query),
            )
        )
    else:
        k = 5
        shift = max(0, min(len(products) - visible, products.index((query, price)) - 1))
        s3 = frame(4, results=len(products), offset=shift)
        ep.steps += [
            step(
                s2,
                "The results list is longer than the page; the product is further down.",
                "Scroll down the results page",
                "swipe(direction='up', amount=0.5)",
            ),
            step(
                s3,
                f"{query} is now visible in the results.",
                f"Open the result {query}",
                at(ctx, s3, "click", query),
            ),
        ]
    s4 = frame(k, results=None, product=(query, price))
    s5 = frame(k + 1, results=None, product=(query, price))
    ep.steps += [
        step(
            s4,
            f"The product page shows the price {price}.",
            f"Answer that it costs {price}",
            f"response(answer={price!r})",
        ),
        step(s5, "The price has been reported.", "The task is complete", terminate(True, rng)),
    ]


def web_search(ctx: Ctx) -> Episode:
    """Shop: search, wait for the results spinner, swipe a long list of results, open one, answer
    its price."""
    rng = ctx.rng
    # Most searches fill more than a page; some find only a few products, and the rows a
    # longer list would show stand empty.
    products = rng.sample(PRODUCTS, rng.choice(RESULT_COUNTS))
    missing = rng.random() < 0.25
    # In a long list the product is further down the page; a short one shows it at once.
    first = 6 if len(products) > 6 else 0
    query = "vintage typewriter" if missing else products[rng.randint(first, len(products) - 1)][0]
    s0 = _shop_frame(ctx, products, 0, "", False, None)
    s1 = _shop_frame(ctx, products, 1, "", True, None)
    ep = Episode(
        "web_search",
        "web",
        "ShopLite",
        [
            f"Find the price of '{query}' on ShopLite.",
            f"Search ShopLite for {query} and tell me how much it costs.",
            f"How much is the {query} on the ShopLite store?",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The ShopLite home page has a search box at the top.",
            "Click the search box",
            at(ctx, s0, "click", "Search products"),
        ),
        step(
            s1,
            "The search box is focused.",
            f"Type {query} and press Enter to search",
            f"write(message={query!r})",
            "press(keys='enter')",
        ),
        step(
            _shop_frame(ctx, products, 2, query, False, None, loading=True),
            "The search is running; a spinner stands where the results will appear.",
            "Wait 2 seconds for the search results to load",
            "wait(seconds=2)",
        ),
    ]
    if not missing:
        _shop_found(ctx, ep, products, query)
        return ep
    ep.outcome = "failure"
    ep.steps.append(
        step(
            _shop_frame(ctx, products, 3, query, False, 0),
            "The store has no results for this product.",
            "Give up, the product is not sold here",
            terminate(False, rng, "no results"),
        )
    )
    return ep


def web_report(ctx: Ctx) -> Episode:
    """Dashboard: start a report, *wait* while a spinner shows, then read the total.

    The ``wait`` step is ground truth for timing: its screen shows a loading spinner and the
    next screen the loaded content.
    """
    (w, h), rng = ctx.size, ctx.rng
    month = rng.choice(("January", "February", "March", "April", "May", "June"))
    rows = [(p, rng.randint(3, 40)) for p, _ in rng.sample(PRODUCTS, 5)]
    total = sum(n for _, n in rows)
    seconds = rng.choice((2, 3, 5))

    def frame(k: int, view: str) -> Screen:
        scr, page = browser(w, h, ctx.clock(k), "http://sales.test/reports", "Sales reports")
        u = scr.u
        x0, y = page[0] + u(60), page[1] + u(40)
        scr.text((x0, y), f"Sales report - {month}", 24)
        if view == "start":
            scr.button((x0, y + u(50), x0 + u(200), y + u(90)), "Generate report", True)
        elif view == "loading":
            scr.spinner((page[0] + page[2]) // 2, (page[1] + page[3]) // 2, "Loading...")
        else:
            labels = [f"{name}: {n} sold" for name, n in rows] + [f"Total: {total} units"]
            scr.rows((x0, y + u(50), page[2] - u(60), page[3] - u(20)), labels, 0, 44)
        return scr

    s0, s1, s2, s3 = frame(0, "start"), frame(1, "loading"), frame(2, "table"), frame(3, "table")
    ep = Episode(
        "web_report",
        "web",
        "Sales",
        [
            f"Generate the {month} sales report and tell me the total units sold.",
            f"How many units were sold in {month}? Use the sales report page.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The report page has a Generate report button.",
            "Click Generate report",
            at(ctx, s0, "click", "Generate report"),
        ),
        step(
            s1,
            "A spinner shows that the report is still loading; nothing can be read yet.",
            f"Wait {seconds} seconds for the report to load",
            f"wait(seconds={seconds})",
        ),
        step(
            s2,
            f"The report has loaded; the last row shows the total of {total} units.",
            f"Answer {total} units",
            f"response(answer='{total} units')",
        ),
        step(s3, "The total has been reported.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def web_form(ctx: Ctx) -> Episode:
    """Contact form: click each of two fields, type into it, tick a box, submit."""
    (w, h), rng = ctx.size, ctx.rng
    name = rng.choice(PEOPLE)
    email = name.split()[0].lower() + "@example.org"

    def frame(k: int, n: str, e: str, agreed: bool, sent: bool = False, focus: str = ""):
        scr, page = browser(w, h, ctx.clock(k), "http://helpdesk.test/contact", "Contact us")
        u = scr.u
        x0, y = page[0] + u(80), page[1] + u(40)
        if sent:
            scr.text((x0, y), f"Thanks, {n}! Your message was sent.", 22)
            scr.button((x0, y + u(40), x0 + u(180), y + u(76)), "Back to home")
            return scr
        scr.text((x0, y), "Contact us", 24)
        for i, (label, value) in enumerate((("Full name", n), ("Email address", e))):
            top = y + u(50) + i * u(70)
            scr.text((x0, top), label, 13)
            scr.field((x0, top + u(14), x0 + u(420), top + u(46)), label, value, label == focus)
        scr.checkbox(x0, y + u(200), "I agree to the privacy policy", agreed)
        scr.button((x0, y + u(240), x0 + u(120), y + u(276)), "Submit", True)
        return scr

    # Each field is clicked, then typed into: the click is the step the typing depends on.
    s0 = frame(0, "", "", False)
    s1 = frame(1, "", "", False, focus="Full name")
    s2 = frame(2, name, "", False)
    s3 = frame(3, name, "", False, focus="Email address")
    s4 = frame(4, name, email, False)
    s5 = frame(5, name, email, True)
    s6 = frame(6, name, email, True, sent=True)
    ep = Episode(
        "web_form",
        "web",
        "Helpdesk",
        [
            f"Submit the contact form as {name} with email {email}.",
            f"Fill in the helpdesk contact form for {name} ({email}) and send it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The contact form is empty; the Full name field comes first.",
            "Click the Full name field",
            at(ctx, s0, "click", "Full name"),
        ),
        step(
            s1,
            "The Full name field has the caret.",
            f"Type {name} into the Full name field",
            f"write(message={name!r})",
        ),
        step(
            s2,
            "The name is filled in; the email field is next.",
            "Click the Email address field",
            at(ctx, s2, "click", "Email address"),
        ),
        step(
            s3,
            "The Email address field has the caret.",
            f"Type {email} into the Email address field",
            f"write(message={email!r})",
        ),
        step(
            s4,
            "Both fields are filled; the privacy checkbox must be ticked before submitting.",
            "Tick the privacy policy checkbox",
            at(ctx, s4, "click", "I agree to the privacy policy"),
        ),
        step(s5, "The checkbox is ticked.", "Click Submit", at(ctx, s5, "click", "Submit")),
        step(
            s6,
            "The confirmation message is shown.",
            "The form was sent, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


CATEGORIES = ("Billing", "Shipping", "Returns", "Account", "Technical")
SUBJECTS = (
    "Order arrived damaged",
    "Refund not received",
    "Cannot log in",
    "Wrong item delivered",
    "Invoice address change",
)


def web_ticket(ctx: Ctx) -> Episode:
    """Support ticket: click the subject field, type, pick a category (which reveals the
    attachment button), attach a screenshot, wait for the upload, submit.

    During the upload the Submit button is drawn greyed out where it is enabled afterwards.
    """
    (w, h), rng = ctx.size, ctx.rng
    subject = rng.choice(SUBJECTS)
    category = rng.choice(CATEGORIES)

    def frame(k: int, view: str, text: str = "", focus: bool = False, cat: str | None = None):
        scr, page = browser(w, h, ctx.clock(k), "http://helpdesk.test/tickets/new", "New ticket")
        u = scr.u
        x0, y = page[0] + u(80), page[1] + u(40)
        if view == "sent":
            scr.text((x0, y), f"Ticket created: {subject}", 22)
            scr.button((x0, y + u(40), x0 + u(180), y + u(76)), "View tickets")
            return scr
        scr.text((x0, y), "New support ticket", 24)
        scr.text((x0, y + u(50)), "Subject", 13)
        scr.field((x0, y + u(64), x0 + u(520), y + u(96)), "Subject", text, focus)
        scr.text((x0, y + u(120)), "Category", 13)
        scr.rows(
            (x0, y + u(134), x0 + u(300), y + u(134) + u(36) * len(CATEGORIES)),
            list(CATEGORIES),
            0,
            36,
            role="listitem",
            selected=cat,
        )
        submit = (x0, y + u(460), x0 + u(120), y + u(496))
        if cat is not None:
            # The attachment section shows only once a category is chosen.
            scr.text((x0 + u(420), y + u(150)), f"{cat}: add a screenshot if it helps", 13)
            attach = (x0 + u(420), y + u(180), x0 + u(620), y + u(216))
            if view == "form":
                scr.button(attach, "Attach screenshot")
            else:
                scr.text((x0 + u(420), y + u(198)), "screenshot.png", 13)
            if view == "uploading":
                bar = (x0 + u(420), y + u(230), x0 + u(720), y + u(246))
                scr.progress_bar(bar, 0.3, "Upload progress")
                scr.disabled_button(submit, "Submit")
                return scr
        scr.button(submit, "Submit", True)
        return scr

    s0, s1 = frame(0, "form"), frame(1, "form", focus=True)
    s2 = frame(2, "form", subject)
    s3 = frame(3, "form", subject, cat=category)
    s4 = frame(4, "uploading", subject, cat=category)
    s5 = frame(5, "attached", subject, cat=category)
    s6 = frame(6, "sent")
    ep = Episode(
        "web_ticket",
        "web",
        "Helpdesk",
        [
            f"Open a {category} support ticket titled '{subject}' with a screenshot attached.",
            f"File a helpdesk ticket in {category}: subject '{subject}', attach the screenshot.",
            f"Report '{subject}' to the helpdesk under {category} and attach a screenshot.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The ticket form is empty; the Subject field has no caret.",
            "Click the Subject field",
            at(ctx, s0, "click", "Subject"),
        ),
        step(
            s1,
            "The Subject field has the caret.",
            f"Type {subject} as the subject",
            f"write(message={subject!r})",
        ),
        step(
            s2,
            f"The subject is filled in; the category list shows {category}.",
            f"Click the {category} category",
            at(ctx, s2, "click", category),
        ),
        step(
            s3,
            f"{category} is selected and an Attach screenshot button appeared.",
            "Click Attach screenshot",
            at(ctx, s3, "click", "Attach screenshot"),
        ),
        step(
            s4,
            "The screenshot is uploading: the bar is partly filled and Submit is greyed out.",
            "Wait 2 seconds for the upload to finish",
            "wait(seconds=2)",
        ),
        step(
            s5,
            "The upload finished and Submit is enabled.",
            "Click Submit",
            at(ctx, s5, "click", "Submit"),
        ),
        step(
            s6,
            "The confirmation shows the ticket was created.",
            "The ticket is filed, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep
