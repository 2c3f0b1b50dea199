"""A deterministic corpus of report-like PDFs with questions whose gold page is known, for the retrieval-quality benchmark.

Every page of every document is about one subject of its own (40 hand-written subjects, none used twice, so no
question has two right pages): a heading, a paragraph of prose with the subject's specific facts (a named person,
a site, an identifier, figures, dates) and, on eight subjects, a table. The seed decides which subjects a
document gets and in which order, every name, identifier and figure, which people are mentioned elsewhere, and
which table rows the questions ask about.

Question types (each labelled), written before any retrieval result was seen and never tuned to one:
  paraphrase   asks about the page's subject in other words, sharing few exact words with it (favours dense)
  identifier   names the page's rare identifier (a claim, contract or case number) exactly (favours BM25)
  entity       names a person described on the page (full name and surname) whom two other pages of the same
               document mention in passing (the graph's case: the person's neighbours are on the gold page)
  table        asks for a cell of the page's table, or for the row with the largest value (table units)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

QUESTION_TYPES = ("paraphrase", "identifier", "entity", "table")


@dataclass(frozen=True)
class TableSpec:
    caption: str
    header: tuple[str, ...]  # first column: the row labels
    labels: tuple[str, ...]  # four of these become the rows
    ranges: tuple[tuple[int, int], ...]  # one (low, high) per value column
    cell_question: str  # names {row}; asks for the first value column
    top_question: str  # asks which row has the largest first value


@dataclass(frozen=True)
class Subject:
    heading: str
    text: str  # slots: {person} {last} {site} {code} {month} {day} {year} {year2} {company} and the numbers
    paraphrase: str
    identifier: str  # names {code}
    code: str  # the identifier's pattern: # a digit, @ a capital letter
    numbers: dict[str, Union[tuple[int, int], tuple[float, float]]]  # int ranges draw integers, float ranges one decimal
    table: Optional[TableSpec] = None


@dataclass(frozen=True)
class Question:
    id: str
    type: str  # one of QUESTION_TYPES
    text: str
    document: str  # the gold document's file name (its name in the collection)
    page: int  # the gold page, 0-based
    subject: str  # the gold page's heading


@dataclass(frozen=True)
class Corpus:
    files: list[Path]
    questions: list[Question]
    pages: int  # pages in all documents together
    seed: int


SUBJECTS: tuple[Subject, ...] = (
    Subject(
        "Flood damage at the {site} warehouse",
        "In {month} {year} heavy rain overwhelmed the drainage at the {site} warehouse, and water stood forty "
        "centimetres deep across the loading bays for two days. Insurance claim {code} covers {a} damaged pallets "
        "of stock and the replacement of three forklifts. {person}, the regional logistics manager, moved urgent "
        "orders to a rented hall nearby while pumps cleared the site. {last} has since ordered raised shelving and "
        "a second drainage channel, which are due to be finished before the autumn storms.",
        "Where did a storm leave inventory submerged?",
        "What does insurance claim {code} cover?",
        "CLM-#####",
        {"a": (120, 900)},
    ),
    Subject(
        "Electric delivery vans",
        "During {year} {company} replaced {a} diesel delivery vans with battery-electric models on its urban "
        "routes. The new vehicles, ordered under framework contract {code}, charge overnight at the {site} depot, "
        "where {b} charging points were installed. {person}, head of fleet operations, reports that fuel and "
        "maintenance costs per kilometre fell by a third. {last} plans to convert the remaining long-distance "
        "trucks only once heavier electric models have a range above 500 kilometres. Drivers were trained in "
        "energy-saving driving before the first vans arrived.",
        "How far along is the switch from fossil-fuel vehicles to plug-in ones for last-mile transport?",
        "What was ordered under framework contract {code}?",
        "FC-@@-####",
        {"a": (30, 140), "b": (20, 90)},
    ),
    Subject(
        "Phishing attack on the payroll system",
        "On {day} {month} {year} an employee at the {site} office entered a password on a forged login page, giving "
        "an attacker access to the payroll system for about six hours. The security team logged the event as "
        "incident {code} and reset {a} accounts. No salary payments were diverted, but the bank details of {b} staff "
        "were viewed. {person}, the chief information security officer, has since made two-factor sign-in mandatory "
        "for every employee, and {last} runs simulated phishing exercises each quarter.",
        "Did criminals break into the wage records by tricking a worker with a fake website?",
        "What happened in incident {code}?",
        "INC-######",
        {"a": (40, 400), "b": (15, 300)},
    ),
    Subject(
        "Headquarters move",
        "The head office left its rented tower in the city centre in {month} {year} and moved to a refurbished "
        "textile mill at {site}. The lease, reference {code}, runs for fifteen years at a rent {a} percent below the "
        "previous one. The mill has {b} desks for roughly twice as many staff, who now work in the office on three "
        "days a week. {person}, who managed the move, said the open ground floor is used for customer events and a "
        "canteen. {last} expects the mill to reach its energy target within two years.",
        "To which converted factory did corporate employees shift their main workplace?",
        "What are the terms of lease {code}?",
        "LS/####/@",
        {"a": (8, 35), "b": (180, 700)},
    ),
    Subject(
        "Kettle recall",
        "In {month} {year} the company recalled {a} electric kettles sold as model {code} after reports that the base "
        "could overheat. Customers received a full refund or a replacement from the newer series. The fault was "
        "traced to a thermostat from a single supplier in {site}, which has since been dropped. {person}, director "
        "of product safety, confirmed that {b} incidents were reported and that nobody was seriously hurt. {last} "
        "now requires a second thermal cut-off in every heating appliance.",
        "Why were some devices for boiling water taken back from shoppers?",
        "Why was model {code} recalled?",
        "KX-####@",
        {"a": (2000, 40000), "b": (6, 60)},
    ),
    Subject(
        "Training academy",
        "The training academy at {site} opened its doors in {month} {year}. It offers apprenticeships in welding, "
        "electrical installation and logistics, as well as short courses for supervisors. {person}, the academy's "
        "principal, enrolled {a} apprentices in the first intake, and {last} wants to double that figure by "
        "admitting applicants from partner firms. Course catalogue {code} lists every programme with its duration "
        "and the qualification it leads to. The first graduates passed their final examinations with marks well "
        "above the national average.",
        "Where are young people taught trades such as joining metal and wiring buildings?",
        "What does course catalogue {code} list?",
        "CC-###-##",
        {"a": (25, 120)},
        TableSpec(
            "Course completions by programme",
            ("Programme", "Completed", "Enrolled"),
            ("Welding", "Electrical installation", "Logistics", "Supervisor course", "Forklift licence", "First aid"),
            ((10, 60), (61, 99)),
            "According to the table, how many people completed the {row} programme?",
            "Which programme in the table had the most completions?",
        ),
    ),
    Subject(
        "Solar panels on the {site} plant",
        "A rooftop photovoltaic array with {a} kilowatts of peak capacity went into service on the {site} plant in "
        "{month} {year}. It supplies about {b} percent of the plant's electricity over a year and more than half on "
        "sunny summer days. The panels were installed by a local contractor under grid connection agreement {code}. "
        "{person}, the plant's engineering manager, said the payback period is expected to be seven years. {last} is "
        "now assessing battery storage so that midday surplus can be used in the evening shift.",
        "How much of the factory's power now comes from sunlight captured on top of the building?",
        "What is covered by grid connection agreement {code}?",
        "GCA-####-@@",
        {"a": (400, 2500), "b": (9, 30)},
    ),
    Subject(
        "Collective wage agreement",
        "After four rounds of talks the company and the union signed a new collective agreement, registered as "
        "{code}, in {month} {year}. It raises basic pay by {x} percent this year and a further 2.5 percent next "
        "year, and adds one day of annual leave. A planned strike at the {site} works was called off the evening "
        "before it was due to start. {person}, who led the negotiations for the employees, called the deal fair; "
        "{last} stressed that night-shift allowances were also increased.",
        "How much more will workers earn after the bargaining with their representatives?",
        "What does agreement {code} change?",
        "TV-####/##",
        {"x": (2.5, 7.5)},
    ),
    Subject(
        "Customer satisfaction survey",
        "The annual survey, run by an outside research agency under study number {code}, collected {a} responses "
        "from retail and trade customers. Overall satisfaction rose to {b} out of 100, helped by faster delivery and "
        "a clearer invoice layout. Complaints about the telephone hotline remain the most frequent criticism. "
        "{person}, the customer service director, has hired extra agents for the busy morning hours, and {last} will "
        "publish the next results in spring. Response rates were highest among long-standing trade customers.",
        "How happy are buyers with us, according to the yearly poll?",
        "How many responses did study {code} collect?",
        "ST-######",
        {"a": (800, 6000), "b": (68, 88)},
        TableSpec(
            "Satisfaction score by customer group",
            ("Customer group", "Score", "Responses"),
            ("Retail", "Trade", "Public sector", "Online", "Export", "Wholesale"),
            ((55, 95), (100, 999)),
            "What score did the {row} customer group give in the table?",
            "Which customer group in the table gave the highest score?",
        ),
    ),
    Subject(
        "Acquisition of {site} Instruments",
        "In {month} {year} the group completed the purchase of {site} Instruments, a maker of laboratory sensors "
        "with {a} employees. The price of {b} million euros was paid in cash from existing credit lines, and the "
        "competition authority cleared the deal under case number {code}. {person}, the founder of the acquired "
        "firm, stays on as managing director for at least three years. {last} expects the sensor range to be sold "
        "through the group's distributors in Asia from next year.",
        "Which business making lab measurement devices was bought?",
        "Which deal was cleared under case number {code}?",
        "M.####",
        {"a": (60, 450), "b": (12, 140)},
    ),
    Subject(
        "Water use",
        "Total water withdrawal fell to {a} thousand cubic metres in {year}, mainly because the cooling circuits at "
        "{site} were closed so that the same water is recirculated. Rainwater is now collected from the roofs of two "
        "warehouses and used for cleaning vehicles. The permit for discharging treated water into the river, number "
        "{code}, was renewed without new conditions. {person}, the environmental officer, samples the discharge "
        "weekly, and {last} reports the results to the regional authority.",
        "Why does the company now need less from the municipal supply and wells?",
        "What does permit {code} allow?",
        "WR-@-#####",
        {"a": (90, 800)},
        TableSpec(
            "Water withdrawal by site in thousand cubic metres",
            ("Site", "This year", "Previous year"),
            ("Main plant", "North depot", "Harbour terminal", "East warehouse", "Paint shop", "Test centre"),
            ((10, 300), (10, 300)),
            "How much water did the {row} draw this year according to the table?",
            "Which site in the table withdrew the most water this year?",
        ),
    ),
    Subject(
        "Patent dispute",
        "A competitor sued the company in {month} {year}, claiming that its folding pallet design infringes patent "
        "{code}. The court in {site} rejected the claim at first instance, finding that the hinge mechanism works "
        "differently. The competitor has appealed, and a decision is expected within {a} months. Legal costs so far "
        "amount to {b} thousand euros. {person}, the general counsel, considers the risk of losing the appeal to be "
        "low, and {last} has not set aside a provision.",
        "Is a rival's lawsuit over intellectual property for the collapsible transport platform still open?",
        "Which product is said to infringe patent {code}?",
        "EP #######",
        {"a": (6, 18), "b": (150, 900)},
    ),
    Subject(
        "Changes to the board",
        "{person} joined the management board as chief financial officer on 1 {month} {year}, succeeding a "
        "predecessor who retired after eleven years. {last} previously ran the treasury of a listed shipping "
        "company and holds a doctorate in economics. The supervisory board approved the appointment at its meeting "
        "in {site}, recorded in resolution {code}. The first task of the new board member is to refinance a bond of "
        "{a} million euros that falls due next year. The finance department now also covers procurement and "
        "investor relations.",
        "Who is the new head of finance on the executive team?",
        "What did resolution {code} approve?",
        "SB-###/##",
        {"a": (50, 400)},
    ),
    Subject(
        "Community programme",
        "The company donated {a} thousand euros to youth sports clubs and schools around {site} in {year}. "
        "Employees may also spend two paid days a year volunteering, and {b} of them did so, mostly helping at food "
        "banks and river clean-ups. {person}, who coordinates the programme, selects projects together with the "
        "local council, and {last} visits every funded club once a year. Grant round {code} will open in {month} "
        "and favours projects that teach children to swim.",
        "What charitable giving and unpaid help did personnel provide to neighbourhoods?",
        "What does grant round {code} favour?",
        "GR-####",
        {"a": (40, 400), "b": (90, 700)},
    ),
    Subject(
        "New planning software",
        "The old enterprise resource planning system, in use since 1998, was replaced by a cloud-based suite in "
        "{month} {year}. The switch-over, tracked as programme {code}, took {a} months and cost {b} million euros, "
        "about ten percent more than budgeted. For two weeks after go-live, invoices at the {site} branch were "
        "delayed because product codes had been mapped incorrectly. {person}, the chief information officer, said "
        "the data has been corrected, and {last} will retire the last server of the old system this year.",
        "How did moving the business management tool to an online platform go?",
        "What did programme {code} cost?",
        "PRG-@####",
        {"a": (9, 30), "b": (3, 25)},
    ),
    Subject(
        "Workplace safety",
        "The lost-time injury rate fell to {x} per million hours worked, the lowest figure since records began. "
        "Most injuries were cuts and strains during manual handling at {site}. {person}, the health and safety "
        "manager, introduced lifting aids and a near-miss reporting app, through which {a} reports were filed. "
        "{last} also trained every shift leader in first aid. Audit {code} found the safety management system "
        "compliant with the international standard. Contractors working on the premises are now included in the "
        "statistics.",
        "How often were people hurt on the job badly enough to stay home?",
        "What did audit {code} find?",
        "AUD-##-####",
        {"x": (1.2, 6.8), "a": (150, 1200)},
        TableSpec(
            "Lost-time injuries by site",
            ("Site", "Injuries", "Hours worked (thousands)"),
            ("Assembly hall", "Foundry", "Warehouse", "Workshop", "Offices", "Yard"),
            ((0, 25), (100, 900)),
            "How many injuries did the {row} record according to the table?",
            "Which site in the table had the most injuries?",
        ),
    ),
    Subject(
        "Steel supply contract",
        "To secure its main raw material, the company signed a five-year contract with a mill near {site} for {a} "
        "thousand tonnes of coil steel a year. The contract, number {code}, links the price to a published index "
        "with a cap, which protects margins if prices spike again as in 2021. {person}, the purchasing director, "
        "negotiated the deal in {month} {year}, and {last} keeps a second supplier under contract for a quarter of "
        "the volume. Deliveries arrive by barge, which keeps the mill's trucks off the local roads.",
        "How is the company protecting itself from swings in what it pays for metal?",
        "What does contract {code} cover?",
        "SC-####-@",
        {"a": (20, 200)},
    ),
    Subject(
        "Server room outage",
        "On {day} {month} a cooling unit failed in the server room at {site}, and systems shut down automatically "
        "when temperatures passed 35 degrees. Online ordering was unavailable for {a} hours, and an estimated {b} "
        "orders were lost. The post-incident review, report {code}, found that the backup chiller had been switched "
        "off for maintenance without a replacement plan. {person}, the head of IT operations, has since moved the "
        "web shop to a second location, and {last} tests the failover each month.",
        "Why couldn't customers buy through the website for part of a day?",
        "What did report {code} find?",
        "PIR-####",
        {"a": (3, 19), "b": (200, 3000)},
    ),
    Subject(
        "Research partnership",
        "Together with the technical university in {site}, the company runs a three-year research project on "
        "recycled plastics for housings. Public funding under grant {code} covers {a} percent of the budget. Two "
        "doctoral students work on the project full time, and the first prototype housing made from 80 percent "
        "recycled material passed impact tests in {month}. {person}, professor of polymer engineering, leads the "
        "academic side, and {last} will present results at a conference in autumn. The partners will share any "
        "resulting patents equally.",
        "Which academic collaboration studies reusing old synthetic materials for product casings?",
        "What is funded by grant {code}?",
        "RG-#####-@",
        {"a": (30, 70)},
    ),
    Subject(
        "Energy consumption",
        "Electricity and gas consumption together came to {a} gigawatt hours in {year}, {b} percent less than the "
        "year before. The largest saving came from replacing compressors at {site} with variable-speed models. An "
        "energy audit under certificate {code} identified further measures, including heat recovery from the "
        "drying ovens. {person}, the energy manager, tracks consumption of every building on a live dashboard, and "
        "{last} reports to the board quarterly. Most of the electricity is bought under a renewable supply contract.",
        "How much power and fuel did operations need overall?",
        "What did the audit under certificate {code} identify?",
        "EN-####-##",
        {"a": (40, 400), "b": (3, 15)},
        TableSpec(
            "Energy consumption by carrier in gigawatt hours",
            ("Carrier", "This year", "Previous year"),
            ("Electricity", "Natural gas", "District heating", "Diesel", "Heating oil", "Propane"),
            ((5, 150), (5, 150)),
            "How many gigawatt hours of {row} were used this year according to the table?",
            "Which energy carrier in the table was used the most this year?",
        ),
    ),
    Subject(
        "Greenhouse gas emissions",
        "Scope 1 and 2 emissions fell to {a} thousand tonnes of CO2 equivalent, a reduction of {b} percent against "
        "the 2019 baseline. The target, validated under reference {code}, is a cut of 50 percent by 2030. Most of "
        "the remaining emissions come from the gas-fired furnaces at {site}, which will be converted to "
        "hydrogen-ready burners. {person}, head of sustainability, also began measuring emissions in the supply "
        "chain, which {last} estimates to be six times larger.",
        "How much has the climate-warming pollution of the business dropped?",
        "What target was validated under reference {code}?",
        "SBT-@@-####",
        {"a": (20, 300), "b": (12, 40)},
    ),
    Subject(
        "Heat pump launch",
        "The new series of heat pumps for apartment buildings, sold as model {code}, was launched at the trade fair "
        "in {site} in {month}. The units deliver {a} kilowatts of heating and are quieter than any competitor model "
        "in the same class. Pre-orders reached {b} units within the first month. {person}, the product manager, "
        "expects the series to account for a fifth of sales within three years, and {last} is preparing a smaller "
        "version for single-family homes.",
        "What new climate appliance for blocks of flats was introduced at an exhibition?",
        "How many pre-orders did model {code} receive?",
        "HP-###@",
        {"a": (30, 120), "b": (300, 2500)},
    ),
    Subject(
        "Company pension plan",
        "From {month} {year} every employee is enrolled automatically in the company pension plan unless they opt "
        "out. The company adds {a} percent of salary on top of each employee's own contribution. The plan's assets "
        "of {b} million euros are managed by an independent trustee in {site} under mandate {code}. {person}, the "
        "human resources director, said participation rose from 61 to 94 percent after the change. {last} will "
        "offer financial advice sessions to staff over the age of 50.",
        "How does the firm help its people save for retirement?",
        "Who manages the assets under mandate {code}?",
        "MD-#####",
        {"a": (2, 8), "b": (40, 600)},
    ),
    Subject(
        "Entry into Brazil",
        "The company opened a sales subsidiary in Brazil in {month} {year}, registered under company number {code}. "
        "A local partner in {site} handles warehousing and customs clearance. First-year orders reached {a} million "
        "euros, mostly from agricultural machinery makers. {person}, the subsidiary's managing director, has hired "
        "{b} sales engineers, and {last} plans a service centre once the installed base justifies it. Spare parts "
        "are shipped from Europe every two weeks.",
        "How is business going in the South American country where a new office was set up?",
        "Which subsidiary is registered under company number {code}?",
        "##.###.###/0001",
        {"a": (3, 30), "b": (4, 20)},
    ),
    Subject(
        "Product quality",
        "The share of products returned under warranty fell to {x} percent, the best result in five years. Much of "
        "the improvement came from automated optical inspection at the end of the line in {site}, which catches "
        "solder faults before packing. Quality report {code} lists the main causes of the remaining returns. "
        "{person}, the quality director, has set a target of halving returns again by {year2}, and {last} reviews "
        "every field failure with the design team each week.",
        "How often did faulty items come back from buyers lately?",
        "What does quality report {code} list?",
        "QR-####-@",
        {"x": (0.4, 3.5)},
        TableSpec(
            "Warranty returns by product line",
            ("Product line", "Returns", "Units sold"),
            ("Controllers", "Sensors", "Drives", "Displays", "Cables", "Power supplies"),
            ((20, 900), (5000, 90000)),
            "How many returns were there for {row} in the table?",
            "Which product line in the table had the most returns?",
        ),
    ),
    Subject(
        "New distribution centre",
        "Construction of the new distribution centre at {site} started in {month} {year} after the building "
        "permit, file {code}, was granted. The hall will cover {a} square metres and hold {b} pallet spaces served by "
        "automated shuttles. It replaces three smaller rented warehouses and should cut truck journeys between them "
        "by two thirds. {person}, the project manager, expects the building to be handed over in eighteen months; "
        "{last} has already hired the first shift leaders. The roof is designed to carry solar panels later.",
        "What large storage and shipping facility is being erected?",
        "What was granted under file {code}?",
        "BP-####-###",
        {"a": (12000, 60000), "b": (8000, 40000)},
    ),
    Subject(
        "Tax audit",
        "The tax authority completed its audit of the years 2017 to 2020 in {month} {year}. It questioned the "
        "transfer prices charged between the parent company and the subsidiary in {site}, and assessment notice "
        "{code} demands additional tax of {a} thousand euros plus interest. The company has paid the amount to "
        "avoid further interest but has filed an objection. {person}, head of tax, believes at least half will be "
        "refunded, and {last} has updated the transfer pricing documentation. A provision covers the remaining "
        "risk for the years after 2020.",
        "What did the revenue inspectors challenge about charges between group entities?",
        "How much does assessment notice {code} demand?",
        "StN ###/###/#####",
        {"a": (200, 3000)},
    ),
    Subject(
        "Employee health programme",
        "The health programme launched in {month} {year} offers free check-ups, flu vaccinations and subsidised gym "
        "membership. The canteen at {site} now serves a vegetarian main course every day and labels the calories of "
        "each dish. Sick days fell to {x} per employee, compared with {y} a year earlier. {person}, the company "
        "doctor, runs the check-ups; {last} says that {a} employees used them in the first year. The programme is "
        "documented in works agreement {code}.",
        "What wellbeing measures does the employer offer its workforce?",
        "What is documented in works agreement {code}?",
        "BV-###-####",
        {"x": (6.0, 9.0), "y": (9.1, 14.0), "a": (200, 1500)},
    ),
    Subject(
        "Green bond",
        "In {month} {year} the company placed its first green bond, a {a} million euro issue with a coupon of {x} "
        "percent and a term of seven years, listed under the securities number {code}. Demand from investors was "
        "{b} times the amount offered. The proceeds finance solar arrays, electric vans and efficient compressors. "
        "{person}, the treasurer, arranged the issue with two banks in {site}, and {last} will report every year on "
        "how the money has been spent.",
        "How did the firm raise money from debt markets for environmentally friendly investments?",
        "What is listed under securities number {code}?",
        "XS##########",
        {"a": (100, 600), "x": (1.5, 5.5), "b": (2, 6)},
    ),
    Subject(
        "Loss of a key customer",
        "The largest customer, a retailer with {a} stores, ended its supply agreement in {month} {year} and moved "
        "its private-label orders to a cheaper producer in {site}. The account, known internally as {code}, had "
        "contributed about {b} percent of revenue. The company has reduced the night shift on two lines and is "
        "redirecting capacity to new customers. {person}, the sales director, won two smaller chains that together "
        "replace about half of the lost volume, and {last} expects the gap to close by next summer.",
        "What happened after the biggest client walked away?",
        "What happened to account {code}?",
        "KA-@@@-###",
        {"a": (150, 1200), "b": (8, 22)},
    ),
    Subject(
        "Fire in the paint shop",
        "A fire broke out in the paint shop at {site} in the early hours of {day} {month}. The sprinkler system "
        "contained it within minutes, and the fire brigade reported no injuries. Production on the line stopped for "
        "{a} days while soot was cleaned from the ovens and ducts. The fire investigator's report, case {code}, "
        "blames a short circuit in an extractor fan. {person}, the plant manager, estimated the damage at {b} "
        "thousand euros, most of which {last} expects the insurer to pay.",
        "What caused the blaze in the coating department?",
        "What does case {code} blame?",
        "FI-####-@@",
        {"a": (3, 21), "b": (300, 2500)},
    ),
    Subject(
        "Dividend and share buyback",
        "The board proposes a dividend of {x} euros per share for {year}, up from last year, which returns about {a} "
        "percent of net profit to shareholders. In addition, a buyback programme approved under authorisation {code} "
        "allows the company to repurchase up to {b} million euros of its own shares by the end of next year. The "
        "annual general meeting will take place in {site} on {day} {month}. {person}, head of investor relations, "
        "answers questions from shareholders, and {last} publishes the weekly buyback volumes.",
        "How much will investors receive as a payout per stock?",
        "What does authorisation {code} allow?",
        "AGM-####-#",
        {"x": (0.4, 3.9), "a": (30, 60), "b": (20, 200)},
    ),
    Subject(
        "Employees",
        "At the end of {year} the company employed {a} people, {b} more than a year earlier, most of them in "
        "production. Women hold 31 percent of management positions, and the target under diversity plan {code} is "
        "40 percent. Staff turnover was lowest at {site} and highest among warehouse workers in their first year. "
        "{person}, head of recruitment, introduced a buddy scheme for new starters, and {last} reports the figures to "
        "the works council. The average length of service is eleven years.",
        "How many individuals does the organisation have on its payroll?",
        "What is the target under diversity plan {code}?",
        "DP-####",
        {"a": (1500, 9000), "b": (40, 400)},
        TableSpec(
            "Employees by function",
            ("Function", "Employees", "Share of women"),
            ("Production", "Logistics", "Sales", "Research", "Administration", "Service"),
            ((80, 3000), (10, 60)),
            "How many employees work in {row} according to the table?",
            "Which function in the table has the most employees?",
        ),
    ),
    Subject(
        "Waste and recycling",
        "The plants produced {a} tonnes of waste in {year}, of which {b} percent was recycled. Metal shavings are "
        "sold back to the steel mill, and a new press at {site} compacts cardboard so that fewer collections are "
        "needed. Hazardous waste such as solvent residues is collected by a licensed firm under disposal contract "
        "{code}. {person}, the environmental coordinator, wants to send no waste to landfill by 2027, and {last} has "
        "started a pilot with reusable transport boxes.",
        "What share of the factories' leftover material gets reused instead of dumped?",
        "Who collects the residues under disposal contract {code}?",
        "DC-@####",
        {"a": (2000, 20000), "b": (55, 92)},
    ),
    Subject(
        "Innovation award",
        "The engineering team at {site} won the national innovation prize in {month} {year} for a gearbox that "
        "needs no oil changes during its service life. The jury, chaired by {person}, praised the sealed "
        "lubrication design, which is protected by patent application {code}. The prize comes with {a} thousand "
        "euros, which the team has donated to a school robotics club. {last} presented the award at a ceremony "
        "attended by {b} guests. Series production of the gearbox begins next spring at a new assembly line.",
        "Which honour did engineers receive for a transmission that never needs fresh lubricant?",
        "What is protected by patent application {code}?",
        "DE ## #### ###.#",
        {"a": (10, 50), "b": (150, 600)},
    ),
    Subject(
        "Price increases",
        "Higher costs for energy, steel and freight led the company to raise list prices by {x} percent on {day} "
        "{month} {year}. Most customers accepted the increase, although two distributors in {site} shifted part of "
        "their orders to competitors. Price list {code} applies to all new orders, while existing framework "
        "contracts are adjusted at their next renewal. {person}, the head of pricing, estimates that the increase "
        "adds {b} million euros to revenue, and {last} will review prices again in the autumn.",
        "Why did the business charge its clients more for its goods?",
        "When does price list {code} apply?",
        "PL-####-@",
        {"x": (2.0, 9.5), "b": (4, 60)},
    ),
    Subject(
        "Freight moved to rail",
        "Since {month} {year}, containers for the northern ports travel by rail from a terminal at {site} instead of "
        "by road. Each train replaces about {a} truck journeys, and the rail operator's service contract, number "
        "{code}, guarantees three departures a week. Transit time rose by half a day, which customers accepted "
        "after the change was announced early. {person}, the head of transport, calculates that the switch avoids "
        "{b} tonnes of emissions a year; {last} is negotiating a fourth weekly departure.",
        "How are shipments to the seaside harbours now carried over tracks rather than highways?",
        "What does service contract {code} guarantee?",
        "RC-##-#####",
        {"a": (25, 45), "b": (800, 5000)},
    ),
    Subject(
        "Compliance and whistleblowing",
        "The anonymous reporting channel received {a} reports in {year}, most of them about workplace conduct. One "
        "report led to the dismissal of a purchasing employee in {site} who had accepted gifts from a supplier, and "
        "the case, file {code}, was passed to the public prosecutor. All {b} managers completed the annual "
        "anti-corruption training. {person}, the chief compliance officer, reports directly to the supervisory "
        "board, and {last} has commissioned an external review of the channel. Reports can be made in twelve "
        "languages, by telephone or online.",
        "Was anyone fired after a confidential tip about bribery?",
        "What happened in file {code}?",
        "CMP-#####",
        {"a": (12, 90), "b": (120, 800)},
    ),
    Subject(
        "Capital expenditure",
        "Capital expenditure reached {a} million euros in {year}, the highest amount in a decade. The largest item "
        "was a laser cutting line at {site}, approved under investment request {code}, which doubles sheet metal "
        "capacity. Smaller amounts went into forklifts, IT hardware and roof repairs. {person}, the controller "
        "responsible for investments, requires a payback within five years for every project, and {last} expects "
        "spending to fall back to {b} million euros next year. Maintenance spending is not included in these "
        "figures.",
        "How much was spent on new equipment and facilities this year?",
        "What was approved under investment request {code}?",
        "IR-##-###",
        {"a": (40, 250), "b": (20, 39)},
        TableSpec(
            "Capital expenditure by category in million euros",
            ("Category", "Actual", "Budget"),
            ("Machinery", "Buildings", "IT hardware", "Vehicles", "Tooling", "Software"),
            ((1, 90), (1, 90)),
            "What was the actual spending on {row} in the table?",
            "Which category in the table had the highest actual spending?",
        ),
    ),
    Subject(
        "Interest rate hedging",
        "To protect against rising interest rates, the treasury fixed the rate on {a} million euros of "
        "floating-rate loans with interest rate swaps in {month} {year}. The swaps, booked under trade reference "
        "{code}, run until 2029 and were concluded with a bank in {site}. As a result, {b} percent of total debt now "
        "carries a fixed rate. {person}, the group treasurer, reviews the hedging policy with the audit committee "
        "every quarter, and {last} does not plan further swaps this year.",
        "How does the company shield itself from higher borrowing costs?",
        "What was booked under trade reference {code}?",
        "TR-########",
        {"a": (50, 500), "b": (55, 90)},
    ),
)

COMPANIES = (
    "Brantley Industries", "Corvane Group", "Elmstead Manufacturing", "Farrowdale Systems", "Graniteforge",
    "Holloway Pike", "Ivers Technik", "Juniper Works", "Kestrel Dynamics", "Larchmont Tools",
)
FIRST_NAMES = (
    "Marta", "Jonas", "Ingrid", "Tomasz", "Aiko", "Rafael", "Leonie", "Osman", "Greta", "Nikolai", "Priya", "Henrik",
    "Sofia", "Mateo", "Yara", "Cedric", "Elin", "Dmitri", "Amara", "Lukas", "Noor", "Bastian", "Fiona", "Kwame",
    "Ilse", "Tariq", "Mireille", "Anton", "Chiara", "Rolf", "Hana", "Emeka", "Vera", "Olek", "Saskia", "Joaquin",
    "Linnea", "Farid", "Ottilie", "Radu",
)
LAST_NAMES = (
    "Okafor", "Lindqvist", "Brenner", "Kowalczyk", "Tanabe", "Moreau", "Haverkamp", "Castellano", "Nyberg",
    "Petrov", "Raghunathan", "Vasquez", "Oyelaran", "Dittmar", "Falkenberg", "Szabo", "Achterberg", "Ishikawa",
    "Delacroix", "Mbeki", "Rasmussen", "Quintero", "Vogelsang", "Halloran", "Zielinski", "Abernethy", "Kuznetsova",
    "Wexford", "Baptiste", "Lindholm", "Gallagher", "Ferreira", "Novak", "Sorensen", "Takahashi", "Adeyemi",
    "Marchetti", "Grunewald", "Eriksen", "Whitcombe",
)
SITES = (
    "Kessler Point", "Marlow Heath", "Oldbridge", "Thornvale", "Ashcombe", "Brackenridge", "Coldwater Bay",
    "Dunmore", "Elderford", "Fallowmere", "Greystone", "Hartwell", "Ivybridge", "Juniper Flats", "Kingsmere",
    "Larkspur", "Millbrook", "Northgate", "Otterburn", "Pembury", "Quarry Hill", "Redhaven", "Stonebury",
    "Tidewater", "Upton Vale", "Westerholm", "Yarrowby", "Alderney Cross", "Birchmoor", "Copperfield",
    "Drayton Marsh", "Eastwick", "Foxhollow", "Glenrock", "Hollins End", "Ironbridge", "Kirkwall Quay",
    "Lowmoor", "Merriton", "Netherby",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)
# Passing mentions of a person on pages about other subjects (the entity questions' distractors).
MENTIONS = (
    "{person} reviewed the figures on this page before publication.",
    "Comments from {person} were taken into account here.",
    "{person} was consulted on this topic as well.",
    "A summary of this section was sent to {person}.",
)
ENTITY_QUESTIONS = (
    "What is {person} responsible for?",
    "What does the report say about {person}?",
    "What role does {person} have?",
    "What has {person} been working on?",
)
REPORT_YEAR = 2023


@dataclass
class _Page:
    subject: Subject
    slots: dict[str, str]
    mentions: list[str]
    rows: list[list[str]]  # the table, header first; empty without one


def write_quality_corpus(folder: Path, documents: int, pages: int, seed: int) -> Corpus:
    """`documents` PDFs of `pages` pages each under `folder`, with their questions; the same seed, the same corpus."""
    if documents * pages > len(SUBJECTS):
        raise ValueError(f"{documents} x {pages} pages need more than the {len(SUBJECTS)} subjects there are")
    if documents > len(COMPANIES):
        raise ValueError(f"at most {len(COMPANIES)} documents")
    rng = random.Random(seed)
    subjects = rng.sample(SUBJECTS, documents * pages)
    first_names, last_names = rng.sample(FIRST_NAMES, len(subjects)), rng.sample(LAST_NAMES, len(subjects))
    sites = rng.sample(SITES, len(subjects))
    codes: set[str] = set()
    folder.mkdir(parents=True, exist_ok=True)
    files, questions = [], []
    for d, company in enumerate(rng.sample(COMPANIES, documents)):
        name = f"report-{d + 1:02d}-{company.split()[0].lower()}.pdf"
        laid_out = []
        for p in range(pages):
            n = d * pages + p
            subject = subjects[n]
            slots = _slots(rng, subject, company, f"{first_names[n]} {last_names[n]}", last_names[n], sites[n], codes)
            laid_out.append(_Page(subject, slots, [], _table(rng, subject.table)))
        # Half the pages (at least one, in documents of three pages or more) get an entity question; their
        # person is mentioned in passing on two other pages of the document.
        targets = sorted(rng.sample(range(pages), max(1, pages // 2))) if pages > 2 else []
        for p in targets:
            for other in rng.sample([q for q in range(pages) if q != p], 2):
                laid_out[other].mentions.append(rng.choice(MENTIONS).format(person=laid_out[p].slots["person"]))
        files.append(_write_pdf(folder / name, f"{company} Annual Report {REPORT_YEAR}", laid_out))
        for p, page in enumerate(laid_out):
            questions += _questions(rng, name, p, page, p in targets)
    return Corpus(files, questions, documents * pages, seed)


def _slots(rng: random.Random, subject: Subject, company: str, person: str, last: str, site: str, codes: set[str]) -> dict[str, str]:
    code = _code(rng, subject.code)
    while code in codes:
        code = _code(rng, subject.code)
    codes.add(code)
    slots = {
        "company": company, "person": person, "last": last, "site": site, "code": code,
        "month": rng.choice(MONTHS), "day": str(rng.randint(1, 28)), "year": str(REPORT_YEAR), "year2": str(REPORT_YEAR + 3),
    }
    for key, (low, high) in subject.numbers.items():
        slots[key] = f"{rng.uniform(low, high):.1f}" if isinstance(low, float) else f"{rng.randint(low, high):,}"
    return slots


def _code(rng: random.Random, pattern: str) -> str:
    return "".join(
        str(rng.randint(0, 9)) if c == "#" else chr(rng.randint(65, 90)) if c == "@" else c for c in pattern
    )


def _table(rng: random.Random, spec: Optional[TableSpec]) -> list[list[str]]:
    if spec is None:
        return []
    rows = [list(spec.header)]
    for label in rng.sample(spec.labels, 4):
        rows.append([label, *(f"{rng.randint(low, high):,}" for low, high in spec.ranges)])
    return rows


def _questions(rng: random.Random, document: str, page_number: int, page: _Page, entity: bool) -> list[Question]:
    subject, slots = page.subject, page.slots
    heading = subject.heading.format(**slots)
    stem = f"{document.removesuffix('.pdf')}-p{page_number}"

    def question(kind: str, text: str, suffix: str = "") -> Question:
        return Question(f"{stem}-{kind}{suffix}", kind, text, document, page_number, heading)

    found = [
        question("paraphrase", subject.paraphrase.format(**slots)),
        question("identifier", subject.identifier.format(**slots)),
    ]
    if entity:
        found.append(question("entity", rng.choice(ENTITY_QUESTIONS).format(person=slots["person"])))
    if subject.table is not None:
        row = rng.choice(page.rows[1:])[0]
        found.append(question("table", subject.table.cell_question.format(row=row), "-cell"))
        found.append(question("table", subject.table.top_question, "-top"))
    return found


def _write_pdf(path: Path, title: str, pages: list[_Page]) -> Path:
    styles = getSampleStyleSheet()
    story: list = [Paragraph(title, styles["Title"])]
    for page in pages:
        slots = page.slots
        story.append(Paragraph(page.subject.heading.format(**slots), styles["Heading2"]))
        story.append(Paragraph(" ".join([page.subject.text.format(**slots), *page.mentions]), styles["BodyText"]))
        if page.rows:
            table = Table(page.rows, colWidths=[5 * cm, 4 * cm, 4.5 * cm])
            table.setStyle(
                TableStyle([("GRID", (0, 0), (-1, -1), 0.8, colors.black), ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold")])
            )
            caption = Paragraph(f"Table: {page.subject.table.caption}.", styles["BodyText"])
            story += [Spacer(1, 0.4 * cm), caption, Spacer(1, 0.2 * cm), table]
        story.append(PageBreak())
    SimpleDocTemplate(str(path), pagesize=A4, title=title, invariant=True).build(story[:-1])
    return path
